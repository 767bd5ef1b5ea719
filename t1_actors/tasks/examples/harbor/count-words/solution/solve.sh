#!/bin/bash
wc -w < /app/poem.txt > /app/words.txt
wc -l < /app/poem.txt > /app/lines.txt
