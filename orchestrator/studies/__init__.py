"""What a sweep file asks for: reading it, expanding its trials, searchers, grouped early stopping,
branch studies."""
