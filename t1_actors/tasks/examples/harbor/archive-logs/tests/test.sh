#!/bin/bash
uv pip install pytest
pytest /tests -rA
