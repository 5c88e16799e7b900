"""``make mutate``: the check that the tests would catch a broken guard (see run.py)."""
