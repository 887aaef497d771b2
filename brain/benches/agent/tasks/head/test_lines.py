import unittest

from lines import head, tail

LINES = ["a", "b", "c", "d", "e"]


class LinesTest(unittest.TestCase):
    def test_head(self):
        self.assertEqual(head(LINES, 2), ["a", "b"])

    def test_head_more_than_all(self):
        self.assertEqual(head(LINES, 9), LINES)

    def test_tail(self):
        self.assertEqual(tail(LINES, 2), ["d", "e"])
        self.assertEqual(tail(LINES, 0), [])


if __name__ == "__main__":
    unittest.main()
