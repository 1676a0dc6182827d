// deep: allocations 60 frames down a recursion, with an exception thrown
// through 20 of those frames and caught, then a snapshot. The kept blocks
// come from `descend` at depth 60.
#include <dlfcn.h>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

// Leaked on purpose: still live when the exit snapshot is taken.
static auto &kept = *new std::vector<std::unique_ptr<std::string>>;

__attribute__((noinline)) static int descend(int depth, int throw_at) {
    if (depth == 0) {
        for (int i = 0; i < 1000; i++) kept.push_back(std::make_unique<std::string>(200, 'x'));
        return 1;
    }
    if (depth == throw_at) throw std::runtime_error("unwound through " + std::to_string(depth) + " frames");
    int below = descend(depth - 1, throw_at);
    return below + 1; // not a tail call: every level keeps its frame
}

int main() {
    int levels = descend(60, -1);
    try {
        descend(40, 20);
    } catch (const std::exception &e) {
        std::printf("caught: %s\n", e.what());
    }
    auto snapshot = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "memgap_snapshot"));
    if (snapshot) snapshot();
    std::printf("levels %d, kept %zu\n", levels, kept.size());
    return 0;
}
