"""The job-fault lab's settings, shared by tests/lab/conftest.py's ``job_fleet`` and the tests
that build a fleet of their own like it: two far-apart hosts at a quarter of their modelled
RTTs, 5 s node timeout."""

JOB_LAB_CITIES = ["Beijing", "Tokyo"]
JOB_NODE_TIMEOUT_S = 5.0
