"""What reads finished runs and bench JSON, on any machine, without mpirun: compare, model accuracy, predict.

It imports the rank package (and the rank programs' result formats) and never lab/ (tests/test_layout.py checks it).
"""
