"""Code patches: the patch and its scope gate, and the sources that propose patches."""
