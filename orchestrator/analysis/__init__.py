"""Pure analysis: runs as records, the critical batch size from scratch and along training, the
learning-rate bracket."""
