"""DFlash drafter training: data, target features, block construction, trainer and CLI."""
