"""7-8. Lossless tree verification and greedy verification, by exact enumeration of every coin."""
