"""The training job's parts, in the order train.run reads them: the job set up on every rank (job.py, replicas.py),
one step (train_step.py), what a finished step owes (after_step.py) and the test set's score (scoring.py)."""
