"""The engine, one package per pipeline stage; imports run one way, down this list:

    config -> data -> model -> train -> evaluation -> ops -> report -> cli

`methods/` (the Method interface and one module per method) sits beside it and imports nothing of `harness`.
"""
