"""``winnow-compare``: run arms x seeds of one base recipe and turn the runs into a claim a reviewer accepts.

- ``plan.py``: the arms, the runs (one output folder each) and each run's state read from its own folder;
- ``runner.py``: the runs one after another here, or as a Slurm array through launch/slurm/train_multinode.slurm;
- ``stats.py``: the statistics, pure functions (paired bootstrap intervals, probability of improvement, IQM);
- ``report.py``: the runs' own logs read back, the pairing check, the markdown report and the figure.
"""
