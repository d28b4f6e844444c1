"""``searchgym doctor``'s checks: is this installation ready to run, and what can it do."""
