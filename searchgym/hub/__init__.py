"""The verifiers hub environment, now :mod:`searchgym.app.hub`; these names stay importable for one release."""
