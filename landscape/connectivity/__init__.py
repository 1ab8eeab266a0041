"""Mode connectivity beyond the straight line: permutation alignment, REPAIR, learned curves
and simplices (issue 17)."""
