"""What several test modules share (spec builders, reference runs); no test module imports another."""
