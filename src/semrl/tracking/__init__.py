"""What a run records: metrics, samples, trees, trackers, its summary."""
