# Fill-in-the-middle on Rust functions against a running `arbor serve`
# (issue 31): each case's body is removed, `/infill` writes it (whole and
# streamed, which must agree), and the file with the middle put back must
# compile (`rustc --edition 2021 --crate-type lib`). Usage:
#   arbor serve --model qwen2.5-coder-1.5b --port 8392
#   python3 benches/serve-infill-rust.py [HOST:PORT] [STRATEGY]
#   (INFILL_SET=2 for the second set of cases)
import json, os, subprocess, sys, tempfile, time, urllib.request

ADDR = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8392"
STRATEGY = sys.argv[2] if len(sys.argv) > 2 else None

# Each case is a file as an editor sends it: the code before the removed
# body, and after it the rest of the file (here, the tests that use it).
CASES = [
    ("gcd", "/// The greatest common divisor of two numbers.\npub fn gcd(a: u64, b: u64) -> u64 {\n",
     "\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn small() {\n        assert_eq!(super::gcd(12, 18), 6);\n    }\n}\n"),
    ("is_palindrome", "/// Whether `s` reads the same backwards, ignoring case and non-letters.\npub fn is_palindrome(s: &str) -> bool {\n",
     "\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn phrase() {\n        assert!(super::is_palindrome(\"A man, a plan, a canal: Panama\"));\n    }\n}\n"),
    ("word_counts", "use std::collections::HashMap;\n\n/// How often each whitespace-separated word occurs in `text`.\npub fn word_counts(text: &str) -> HashMap<String, usize> {\n",
     "\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn twice() {\n        assert_eq!(super::word_counts(\"a b a\")[\"a\"], 2);\n    }\n}\n"),
    ("mean", "/// The arithmetic mean of `xs`, or `None` when it is empty.\npub fn mean(xs: &[f64]) -> Option<f64> {\n",
     "\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn empty() {\n        assert_eq!(super::mean(&[]), None);\n    }\n}\n"),
    ("fib", "/// The n-th Fibonacci number (0, 1, 1, 2, 3, ...).\npub fn fib(n: u32) -> u64 {\n",
     "\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn tenth() {\n        assert_eq!(super::fib(10), 55);\n    }\n}\n"),
    ("Stack", "/// A stack of integers.\npub struct Stack {\n    items: Vec<i32>,\n}\n\nimpl Stack {\n    pub fn new() -> Self {\n        Stack { items: Vec::new() }\n    }\n\n    /// Removes and returns the top item, if any.\n    pub fn pop(&mut self) -> Option<i32> {\n",
     "\n    }\n\n    pub fn push(&mut self, x: i32) {\n        self.items.push(x);\n    }\n}\n"),
]

# A second set of five, written on 2026-11-29 before any of them was run
# (the first set's six gave 5/6): `INFILL_SET=2` runs these instead.
SECOND = [
    ("count_vowels", "/// How many ASCII vowels (either case) `s` contains.\npub fn count_vowels(s: &str) -> usize {\n",
     "\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn hello() {\n        assert_eq!(super::count_vowels(\"Hello World\"), 3);\n    }\n}\n"),
    ("longest", "/// The longest of `words` (the first of equal lengths), or `None` when empty.\npub fn longest<'a>(words: &[&'a str]) -> Option<&'a str> {\n",
     "\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn three() {\n        assert_eq!(super::longest(&[\"a\", \"abc\", \"ab\"]), Some(\"abc\"));\n    }\n}\n"),
    ("Point", "/// A point in the plane.\n#[derive(Debug, Clone, Copy)]\npub struct Point {\n    pub x: f64,\n    pub y: f64,\n}\n\nimpl Point {\n    /// The Euclidean distance to `other`.\n    pub fn distance(&self, other: &Point) -> f64 {\n",
     "\n    }\n}\n\n#[cfg(test)]\nmod tests {\n    use super::Point;\n    #[test]\n    fn three_four_five() {\n        let (a, b) = (Point { x: 0.0, y: 0.0 }, Point { x: 3.0, y: 4.0 });\n        assert_eq!(a.distance(&b), 5.0);\n    }\n}\n"),
    ("parse_pair", "/// Splits `key=value` at the first `=`, trimming spaces around both; `None` without `=`.\npub fn parse_pair(line: &str) -> Option<(String, String)> {\n",
     "\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn spaced() {\n        assert_eq!(super::parse_pair(\" a = b \"), Some((\"a\".to_string(), \"b\".to_string())));\n    }\n}\n"),
    ("transpose", "/// The transpose of a rectangular matrix given as rows.\npub fn transpose(m: &[Vec<i32>]) -> Vec<Vec<i32>> {\n",
     "\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn two_by_three() {\n        let m = vec![vec![1, 2, 3], vec![4, 5, 6]];\n        assert_eq!(super::transpose(&m), vec![vec![1, 4], vec![2, 5], vec![3, 6]]);\n    }\n}\n"),
]
if os.environ.get("INFILL_SET") == "2":
    CASES = SECOND


def post(body, stream=False):
    req = urllib.request.Request(f"http://{ADDR}/infill", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    r = urllib.request.urlopen(req, timeout=600)
    if not stream:
        return json.loads(r.read())
    text, last = "", None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data:"):
            continue
        ev = json.loads(line[5:])
        text += ev["content"]
        if ev["stop"]:
            last = ev
            break
    return text, last


def compiles(source):
    with tempfile.TemporaryDirectory() as d:
        f = f"{d}/case.rs"
        open(f, "w").write(source)
        p = subprocess.run(["rustc", "--edition", "2021", "--crate-type", "lib", "-o", f"{d}/case.rlib", f],
                           capture_output=True, text=True)
        return p.returncode == 0, p.stderr


ok = 0
for name, prefix, suffix in CASES:
    body = {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 200}
    if len(sys.argv) > 3:
        body["filename"] = sys.argv[3]
    if STRATEGY:
        body["arbor"] = {"strategy": STRATEGY}
    t = time.time()
    whole = post(body)
    secs = time.time() - t
    streamed, last = post(dict(body, stream=True), stream=True)
    good, err = compiles(prefix + whole["content"] + suffix)
    ok += good
    a = whole["arbor"]
    print(f"## {name}: compiles={good} streamed==whole={streamed == whole['content']} "
          f"tokens={whole['tokens_predicted']} stop={whole['stop_type']} {secs:.1f}s "
          f"strategy={a['strategy']} tokens/pass={a['tokens_per_pass']:.2f}")
    print("```rust\n" + prefix + whole["content"] + suffix + "```")
    if not good:
        print(err)
print(f"{ok}/{len(CASES)} compile")
