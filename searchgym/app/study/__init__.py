"""Pre-registered studies as files: ``searchgym study run|report|status PROTOCOL.toml``.

A protocol (:mod:`.protocol`) names the warm-start, the options every arm shares, the arms, the seeds, the
frozen control, the evaluation points, the definitions and the criteria. :mod:`.runner` plays its runs as
``searchgym train grpo`` subprocesses and summarises each as it lands (:mod:`.summary`); :mod:`.report`
judges the summaries by the definitions and criteria (:mod:`.rules`). Like the CLI, this package sits above
the agents: it reads their run folders and checks options against ``GRPOConfig``, importing them inside the
functions that need them, so importing it stays free of torch.
"""
