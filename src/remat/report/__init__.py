"""Reports: pure functions from remat's data to text and pictures."""
