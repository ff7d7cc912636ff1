"""The chaos run (`make chaos`): faults against the whole process layout, checked against the simulator."""
