#!/bin/bash
find /var/log/app -name '*.log' -printf '%P\n' | sort > /tmp/logs.list
tar -czf /app/logs.tar.gz -C /var/log/app -T /tmp/logs.list
find /var/log/app -name '*.log' -delete
