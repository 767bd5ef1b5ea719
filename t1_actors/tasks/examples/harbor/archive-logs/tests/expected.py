LOGS = {"boot.log": "boot ok\n", "old/disk.log": "disk warn\n"}
