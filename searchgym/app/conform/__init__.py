"""``searchgym conform``: whether a training stack builds the same batch and loss from the same episodes as the
reference (the adapter interface and runner, the episodes, the token and loss checks, one adapter per stack)."""
