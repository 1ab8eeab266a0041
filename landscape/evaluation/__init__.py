"""The evaluation engine: losses and accuracies of many weight vectors on one data set."""
