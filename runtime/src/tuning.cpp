// tuning.cpp — one table of choices by plan key, filled by timing and by import (stitchrt/tuning.h).
#include "tuning.hpp"

#include <map>
#include <mutex>
#include <sstream>
#include <vector>

namespace st {

namespace {

struct Entry {
  TunedChoice choice;
  bool imported = false;
};

std::mutex g_mu;
std::map<std::string, Entry> g_table;  // "<kind> <words...>" -> choice (ordered: a stable export)

std::string key_text(char kind, const int64_t* words, size_t n) {
  std::string s(1, kind);
  for (size_t i = 0; i < n; ++i) {
    s += ' ';
    s += std::to_string(words[i]);
  }
  return s;
}

}  // namespace

void tuning_record(char kind, const int64_t* words, size_t n, TunedChoice c) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_table[key_text(kind, words, n)] = Entry{c, false};
}

bool tuning_lookup(char kind, const int64_t* words, size_t n, TunedChoice* out) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_table.find(key_text(kind, words, n));
  if (it == g_table.end() || !it->second.imported) return false;  // this process's own choices: timed again
  *out = it->second.choice;
  return true;
}

std::string tuning_export() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::string out;
  for (const auto& [key, e] : g_table) {
    // "<kind> <split> <index> <words...>"
    out += key.substr(0, 1);
    out += ' ' + std::to_string(e.choice.split) + ' ' + std::to_string(e.choice.index);
    out += key.substr(1);
    out += '\n';
  }
  return out;  // an imported choice that a plan timed again afterwards is exported as timed
}

size_t tuning_import(const std::string& text) {
  std::istringstream lines(text);
  std::string line;
  size_t taken = 0;
  std::lock_guard<std::mutex> lock(g_mu);
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    std::string kind;
    int64_t split = 0, index = 0;
    if (!(f >> kind >> split >> index) || (kind != "g" && kind != "c" && kind != "s") || index < 0 || (split != 0 && split != 1))
      continue;
    std::vector<int64_t> words;
    int64_t w = 0;
    while (f >> w) words.push_back(w);
    if (words.empty() || !f.eof()) continue;  // a word that is not a number: not a choice of ours
    g_table[key_text(kind[0], words.data(), words.size())] = Entry{TunedChoice{index, split}, true};
    ++taken;
  }
  return taken;
}

void tuning_clear() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_table.clear();
}

}  // namespace st
