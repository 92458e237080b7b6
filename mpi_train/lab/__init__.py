"""What starts mpirun around jobs: the launch helper, test hosts, experiment files and their runner, the soak,
the tracking bench. It may import everything else; nothing else imports it (tests/test_layout.py checks it).
"""
