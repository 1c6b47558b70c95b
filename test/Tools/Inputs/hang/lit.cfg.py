# A suite of one test that hangs (see ../../lit-timeout.test).
import lit.formats

config.name = "hang"
config.test_format = lit.formats.ShTest(True)
config.suffixes = [".test"]
