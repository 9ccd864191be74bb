"""What a training job imports to talk to the harness: the Reporter (standard library only) and
the Hugging Face and Lightning callbacks."""
