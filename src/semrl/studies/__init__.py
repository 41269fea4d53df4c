"""Multi-seed studies: sweeps, comparisons, statistics and decisions."""
