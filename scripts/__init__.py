"""The commands a person or a job runs (`python -m scripts.<verb>`) and, in the subpackages, their plumbing."""
