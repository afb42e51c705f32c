"""One module per command of `cudatrace`: its click function and its body.

`cli.py` lists them and loads only the one invoked. Each module imports click and `options`
at its top and the floors its body uses inside the body, so that start-up stays small
(tests/integration/test_startup.py). The option groups the commands share are in `options`.
"""
