#!/bin/bash
# Installs pytest (the harness's verifier brings its own) and runs the tests.
pip install pytest==8.4.1
pytest $TEST_DIR/test_outputs.py -rA
