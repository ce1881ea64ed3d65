"""Files read and written: paths, gs://, safe reads and writes (`io_utils`),
the compilation cache, each command's folder (`output_folder`)."""
