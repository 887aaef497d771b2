import unittest

from freq import top


class FreqTest(unittest.TestCase):
    def test_counts(self):
        self.assertEqual(top("a b a", 1), [("a", 2)])

    def test_case_does_not_matter(self):
        self.assertEqual(top("The cat saw the dog. THE end.", 1), [("the", 3)])


if __name__ == "__main__":
    unittest.main()
