"""The papers' claims, measured: definitions as data, the runs behind them, their statistics and the page.

A package of its own, above both the analysis core (``landscape``) and the FL engine (``fl``):
a claim trains FL runs and central models and measures them with the core, and the core may
not import the engine (nor ``fl`` the core's analyses). ``landscape.claims`` keeps what needs
no engine: the verdict vocabulary (``Outcome``), the statistics (paired intervals, the decision
rule, p-values and Holm's adjustment) and the checks of a user's own models.

* :mod:`paper_claims.definitions`: every claim (paper, statement, arms, metric, direction,
  tolerance and its reason) and every claim group (recipe, finishing gate) as data;
* :mod:`paper_claims.context`: the runs of an arm (:class:`~paper_claims.context.ArmPlan`),
  the run cache, the finishing gate; :mod:`paper_claims.kernels`: the pinned CPU kernels;
* one module per claim group (``fedgucci``, ``transitivity``, ``ima``, ``floco``, ``lss``),
  measuring its arms and building its rows from the definitions;
* :mod:`paper_claims.rows`: rows, verdicts (``landscape.claims.Outcome``), the table and its
  Holm column; :mod:`paper_claims.page`: the Markdown page;
* :mod:`paper_claims.runner`, :mod:`paper_claims.cli` and :mod:`paper_claims.dry_run`: the
  command ``python -m paper_claims`` and its ``--dry-run``.

Importing the package loads nothing heavy (no torch), so the command can pin the CPU kernels
before torch is imported.
"""
