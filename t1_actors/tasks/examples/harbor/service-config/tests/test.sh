#!/bin/bash
pip install pytest==8.4.1
pytest /tests/test_config.py -rA
