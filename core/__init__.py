"""Domain-agnostic core of wmrl: types, the four interfaces, the WMRL math, the loop."""
