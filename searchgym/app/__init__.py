"""The applications: every command and tool built on the library (the command line, benchmarks, studies,
conformance checks, OpenEnv and the verifiers hub). Nothing in the library imports this package."""
