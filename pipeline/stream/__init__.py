"""The thin faust-streaming shell around the core: topics, stages, the worker app."""
