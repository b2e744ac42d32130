"""What runs inside each Ray Train worker: data, model, train loop."""
