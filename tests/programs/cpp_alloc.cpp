// cpp_alloc: C++ allocation churn through operator new/delete.
//
// new/delete of single objects and arrays, std::vector growth, std::string
// concatenation, a std::map, and an exception thrown and caught (the
// exception object itself is heap-allocated by __cxa_allocate_exception).
// Prints a deterministic summary to stdout and a line to stderr, and exits
// with code 5 (so a test can check the exit code is passed through).
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Node {
    explicit Node(int v) : value(v) {}
    int value;
    Node *next = nullptr;
};

long linked_list(int n) {
    Node *head = nullptr;
    for (int i = 0; i < n; i++) {
        Node *node = new Node(i);
        node->next = head;
        head = node;
    }
    long sum = 0;
    while (head != nullptr) {
        Node *next = head->next;
        sum += head->value;
        delete head;
        head = next;
    }
    return sum;
}

long arrays(int n) {
    long sum = 0;
    for (int i = 1; i <= n; i++) {
        int *values = new int[i];
        for (int j = 0; j < i; j++) values[j] = j;
        sum += values[i - 1];
        delete[] values;
    }
    return sum;
}

std::size_t vectors_and_strings(int n) {
    std::vector<std::string> words;
    for (int i = 0; i < n; i++) {
        std::string word = "word-" + std::to_string(i);
        word += std::string(static_cast<std::size_t>(i % 50), 'x');
        words.push_back(word);
    }
    std::map<std::string, std::size_t> lengths;
    for (const auto &word : words) lengths[word] = word.size();
    std::size_t total = 0;
    for (const auto &entry : lengths) total += entry.second;
    return total;
}

int exceptions(int n) {
    int caught = 0;
    for (int i = 0; i < n; i++) {
        try {
            auto guard = std::make_unique<std::vector<int>>(100, i);
            if (i % 3 == 0) throw std::runtime_error("failure number " + std::to_string(i));
        } catch (const std::runtime_error &error) {
            if (std::string(error.what()).rfind("failure number ", 0) == 0) caught++;
        }
    }
    return caught;
}

}  // namespace

int main() {
    long list = linked_list(10000);
    long array = arrays(2000);
    std::size_t text = vectors_and_strings(5000);
    int caught = exceptions(300);
    std::printf("list %ld\narrays %ld\ntext %zu\ncaught %d\n", list, array, text, caught);
    std::fprintf(stderr, "cpp_alloc: done\n");
    return 5;
}
