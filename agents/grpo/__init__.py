"""GRPO with the LLDS regulariser: pure loss functions, the trainer, and its configuration."""
