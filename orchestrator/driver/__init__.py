"""What the user's command drives on Ray: preflight, one run (train), a sweep's trials, the live
table, the dry run, plan."""
