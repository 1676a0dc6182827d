// cpp_templates: the program's own class and function templates,
// instantiated with long standard-library types, allocate; their demangled
// names (every frame from the allocation site outwards) run to hundreds of
// characters. Prints "rows N".
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace store {

template <typename Key, typename Value>
struct table {
    std::vector<std::pair<Key, Value>> rows;

    template <typename Fill>
    __attribute__((noinline)) void grow(std::size_t n, Fill fill) {
        for (std::size_t i = 0; i < n; i++) rows.emplace_back(fill(i));
    }
};

}  // namespace store

int main() {
    using Key = std::map<std::string, std::vector<std::string>>;
    using Value = std::vector<std::map<int, std::string>>;
    store::table<Key, Value> t;
    t.grow(2000, [](std::size_t i) {
        Key key;
        key["key-" + std::to_string(i)].push_back("a value long enough to leave the small-string buffer");
        return std::make_pair(key, Value(1));
    });
    std::printf("rows %zu\n", t.rows.size());
    return 0;
}
