"""A Ray cluster far away: the Jobs client, submit, upload, follow, the jobs verb."""
