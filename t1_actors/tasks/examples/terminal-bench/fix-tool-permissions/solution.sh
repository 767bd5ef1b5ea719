#!/bin/bash
chmod 755 /usr/local/bin/greet
greet > /app/greeting.txt
