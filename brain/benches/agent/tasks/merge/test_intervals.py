import unittest

from intervals import merge


class MergeTest(unittest.TestCase):
    def test_overlap(self):
        self.assertEqual(merge([(1, 3), (2, 5)]), [(1, 5)])

    def test_apart(self):
        self.assertEqual(merge([(5, 6), (1, 2)]), [(1, 2), (5, 6)])

    def test_touching(self):
        self.assertEqual(merge([(1, 2), (2, 4)]), [(1, 4)])


if __name__ == "__main__":
    unittest.main()
