#!/bin/bash
sed -i 's/^port = 8080$/port = 9090/; s/^log_level = debug$/log_level = info/' /opt/service/config.ini
/opt/service/bin/show-port > /app/port.txt
