#!/bin/bash
cd /var/log/app
find . -name '*.log' | sed 's|^\./||' > /tmp/logs.list
tar -czf /app/logs.tar.gz -T /tmp/logs.list
xargs rm < /tmp/logs.list
