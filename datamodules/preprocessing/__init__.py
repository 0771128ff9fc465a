"""Raw input to network input without torch (numpy, pandas, Pillow): the datamodules' and the registered model's."""
