"""gradebook: averages, letter grades and a class ranking."""
