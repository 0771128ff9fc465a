"""The bench extra's tests: each bench end to end at its smallest size, and the benches' clock."""
