# The base configuration: a larger vocabulary than the script's default.
vocab = 64
block_size = 32
