"""Pure tensor functions, one file per paper; no TRL / accelerate imports here."""
