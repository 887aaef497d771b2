"use strict";

// A URL slug of a title: lower case, each run of spaces one "-".
function slug(title) {
  return title.trim().toLowerCase().replace(/ +/, "-");
}

module.exports = { slug };
