"use strict";
const assert = require("assert");
const { slug } = require("./slug");

assert.strictEqual(slug("Hello"), "hello");
assert.strictEqual(slug("Hello World"), "hello-world");
assert.strictEqual(slug("  A  tale of   two "), "a-tale-of-two");
console.log("ok");
