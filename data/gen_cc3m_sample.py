#!/usr/bin/env python3
"""Deterministic generator of a synthetic Conceptual Captions 3M (CC3M) sample.

Output format is the published ``Train_GCC-training.tsv`` format: one pair per
line, ``caption<TAB>url``, no header, UTF-8, ``\\n`` line endings.

No real CC3M captions are used.  Captions are built from 136 weighted sentence
shapes (stock-photo style, news style, illustrations, "the view from ...",
questions, ...) filled from word lists, then written the way CC3M writes them:
lower case, pre-tokenised (punctuation and clitics such as ``'s`` / ``n't`` are
separate space-delimited tokens) and with named entities replaced by
hypernyms (``actor``, ``person``, ``football team``, ``city``, ...).

Vocabulary: every word slot samples its word list with a Zipf-Mandelbrot law
(rank ~ log-uniform).  Noun and adjective slots additionally draw, with a small
probability, from a long Zipfian tail of deterministic pseudo-words built from
syllables (the same tail for every seed), so the number of distinct words
grows with the number of rows like real data (~10k at 20k rows, ~50k at 2.9M).

Usage::

    python3 data/gen_cc3m_sample.py --rows N --seed S --out PATH [--malformed]

The output is fully determined by (rows, seed, --malformed) (``random.Random``
seeded once; checked byte-identical across runs with CPython 3.11).  Rows are
streamed to the file in chunks of 20,000 lines; only the statistics (a dict of
distinct words) are kept in memory (~40 MB RSS for 2.9M rows).

``--malformed`` inserts 5 extra malformed lines (so the file has N + 5 lines).
Malformed line j (j = 0..4) is written just before valid row
``floor((j + 1) * N / 6)`` (0-based), i.e. at 1-based line number
``floor((j + 1) * N / 6) + j + 1``.  In order they are:

    j=0  a line with no tab (caption only)
    j=1  a line with three tab-separated fields
    j=2  a line with an empty caption (``\\thttp://...``)
    j=3  a line whose caption is only spaces
    j=4  a line containing invalid UTF-8 bytes (``caf\\xe9 on the street .``)

For N = 20000 these are lines 3334, 6668, 10003, 13337 and 16671.  (With
N = 0 the five lines are the whole file.)  Malformed lines are not counted in
N nor in the statistics.

Statistics printed to stderr (valid rows only; tokenisation = lower-case and
split on whitespace, every piece is a word):
  * mean words per caption,
  * mean words after RmStopNalpha (drop words that are not str.isalpha() and
    NLTK English stopwords),
  * distinct words (all tokens) and distinct words after RmStopNalpha.

Python 3.11 standard library only.
"""

import argparse
import random
import sys
import time

# --------------------------------------------------------------------------
# NLTK English stopwords (179), used only for the statistics.
# --------------------------------------------------------------------------
STOPWORDS = frozenset("""
i me my myself we our ours ourselves you you're you've you'll you'd your yours
yourself yourselves he him his himself she she's her hers herself it it's its
itself they them their theirs themselves what which who whom this that that'll
these those am is are was were be been being have has had having do does did
doing a an the and but if or because as until while of at by for with about
against between into through during before after above below to from up down
in out on off over under again further then once here there when where why how
all any both each few more most other some such no nor not only own same so
than too very s t can will just don don't should should've now d ll m o re ve
y ain aren aren't couldn couldn't didn didn't doesn doesn't hadn hadn't hasn
hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't needn needn't
shan shan't shouldn shouldn't wasn wasn't weren weren't won won't wouldn
wouldn't
""".split())
assert len(STOPWORDS) == 179

# --------------------------------------------------------------------------
# Core vocabulary (real English words).  Lists are ordered roughly from
# frequent to rare: the samplers are Zipfian in list position.
# --------------------------------------------------------------------------
OBJECTS = """
car table flower tree dress chair house book cake phone door window bike
bottle cup hat shirt shoe bag boat camera lamp sofa bed clock flag sign
guitar ball toy gift box glass vase candle plate bowl pillow bench umbrella
computer laptop bridge road wall fence gate poster card balloon ribbon
necklace ring watch jacket coat sweater skirt jeans boots sunglasses scarf
helmet backpack suitcase basket bucket truck bus train plane airplane
motorcycle bicycle tractor ship yacht sailboat canoe kayak ferry helicopter
rocket drone tent lantern ladder hammer rope chain wheel tire engine anchor
barrel crate brick stone rock feather leaf branch log wreath bouquet garland
bow letter envelope newspaper magazine notebook map globe pen pencil crayon
paintbrush canvas easel palette tripod lens tablet keyboard monitor screen
television radio speaker headphones microphone piano violin cello drum
trumpet saxophone flute harp accordion ukulele banjo harmonica record ticket
banner kite doll puzzle racket skateboard surfboard snowboard sled scooter
van taxi tram locomotive carriage wagon submarine jet mirror desk shelf
bookcase cabinet wardrobe stool hammock cushion blanket rug carpet curtain
staircase balcony terrace porch fireplace chimney roof floor ceiling
mailbox jar mug teapot kettle pan pot toaster oven stove fridge refrigerator
microwave sink faucet towel soap toothbrush comb hairbrush razor perfume
lipstick bracelet earring brooch pendant tiara crown cap glove mitten sock
sandal sneaker slipper heel blouse vest suit tie trousers pants shorts
swimsuit bikini gown uniform costume apron robe pajamas hoodie cardigan
raincoat belt handbag purse wallet briefcase luggage parcel postcard diary
eraser ruler scissors stapler paper mouse smartphone vinyl flashlight torch
compass wrench screwdriver saw drill axe shovel rake hose wheelbarrow mower
key lock pallet pebble shell twig stump trunk root seed fountain statue
sculpture monument painting mural graffiti mosaic tapestry quilt embroidery
pottery sculpture figurine ornament decoration chandelier lampshade
headboard mattress crib cradle stroller pram highchair playpen swing slide
seesaw trampoline pool jacuzzi bathtub shower toilet tile countertop island
cupboard drawer pantry doormat planter flowerpot birdhouse birdbath
weathervane sundial gazebo pergola trellis arch column pillar beam rafter
chandelier sconce pendant spotlight lightbulb candlestick candelabra
lighthouse windmill watermill tower spire dome facade
""".split()

FOOD = """
food coffee pizza cake salad bread chocolate wine beer tea cheese chicken
burger sandwich pasta soup steak fish rice eggs cookies cupcakes fruit
vegetables apple orange banana lemon strawberry cherry blueberry raspberry
peach pear plum mango pineapple watermelon melon kiwi coconut avocado
tomato potato carrot onion garlic pepper cucumber lettuce cabbage broccoli
pumpkin corn mushroom beans peas olive herbs spices honey jam sauce butter
yogurt milk juice cocktail whiskey lemonade smoothie croissant bagel muffin
donut pie tart cookie biscuit candy noodles sushi tacos burrito curry
dumplings pancakes waffles cereal granola oatmeal porridge omelette bacon
sausage ham salami shrimp lobster crab oyster mussels salmon tuna cod
pudding ice cream gelato sorbet brownie cheesecake macarons meringue
popcorn pretzel nachos fries chips hummus guacamole salsa pesto ketchup
mustard mayonnaise vinegar lime grapefruit fig date apricot nectarine
pomegranate papaya passionfruit lychee cranberry blackberry gooseberry
rhubarb spinach kale celery asparagus zucchini eggplant aubergine radish
beetroot turnip parsnip leek artichoke chili ginger cinnamon vanilla
nutmeg saffron basil parsley rosemary thyme mint oregano dill coriander
cilantro almonds walnuts hazelnuts pistachios peanuts cashews chestnuts
quinoa couscous lentils chickpeas tofu tempeh espresso cappuccino latte
champagne prosecco cider vodka gin rum tequila brandy sangria mojito
margarita baguette brioche focaccia ciabatta pretzel scone crumpet
""".split()

PLANTS = """
flowers roses tulips daisies sunflowers lilies orchids poppies lavender
peonies dandelions lotus cactus fern moss ivy grass palm oak pine maple
birch willow bamboo bush hedge succulents magnolia cherry blossoms
hydrangea camellia chrysanthemum carnation daffodil hyacinth iris jasmine
lilac marigold pansy petunia begonia geranium dahlia zinnia aster azalea
rhododendron wisteria clematis bougainvillea hibiscus frangipani heather
thistle clover buttercup bluebell foxglove snowdrop crocus gardenia
protea anemone ranunculus freesia gerbera primrose violet cypress cedar
spruce fir sequoia redwood eucalyptus acacia baobab olive trees vines
""".split()

ANIMALS = """
dog cat horse bird puppy kitten cow sheep lamb goat pig rabbit bunny
squirrel fox wolf bear deer elephant lion tiger giraffe zebra monkey
panda koala kangaroo owl eagle parrot duck swan chicken butterfly bee
fish dolphin whale turtle frog snake penguin flamingo pony donkey calf
bull piglet hamster mouse rat chipmunk hedgehog elk moose reindeer bison
buffalo camel llama alpaca rhino hippo leopard cheetah jaguar panther
lynx gorilla chimpanzee orangutan lemur sloth otter beaver raccoon badger
skunk bat hawk falcon vulture pigeon dove sparrow robin crow raven goose
duckling rooster hen turkey peacock pelican seagull heron stork crane
hummingbird woodpecker kingfisher moth wasp ant beetle ladybug dragonfly
spider snail toad tortoise lizard crocodile alligator iguana chameleon
goldfish shark seal walrus octopus squid jellyfish starfish unicorn dragon
dinosaur puffin kookaburra toucan macaw cockatoo budgie canary finch
wren magpie jay starling swallow lark nightingale albatross cormorant
meerkat mongoose armadillo anteater porcupine possum opossum wombat
platypus hyena jackal coyote dingo husky poodle labrador retriever beagle
bulldog terrier dachshund chihuahua spaniel collie shepherd greyhound
pug corgi rottweiler dalmatian mastiff stallion mare foal
""".split()

SCENES = """
beach sea ocean lake river mountains forest park garden city street field
sky clouds sunset sunrise snow water waterfall island hill valley coast
shore cliff canyon desert woods jungle meadow farm lawn orchard vineyard
glacier volcano cave bay pond stream countryside village town harbour
harbor pier jetty dock marina bridge road path trail landscape horizon
rainbow storm lightning fog mist moon sun stars galaxy universe space
sand dunes rocks waves surf reef lagoon marsh swamp wetland prairie
savanna tundra plateau peak summit ridge slope gorge fjord estuary delta
creek spring geyser crater ocean floor seabed coastline riverbank
lakeshore seaside waterfront boardwalk promenade skyline rooftops streets
alley avenue boulevard highway motorway crossroads intersection roundabout
square plaza market courtyard backyard playground campsite ski slope
""".split()

BUILDINGS = """
house building church castle tower hotel restaurant cafe bar shop store
museum school station airport stadium office apartment cottage cabin barn
palace cathedral temple mosque skyscraper library university hospital
gallery mall factory warehouse farmhouse villa mansion chalet bungalow
lighthouse windmill ruins fortress monastery chapel synagogue pagoda
shrine theatre theater cinema arena gym spa salon bakery pharmacy bank
casino pub brewery winery greenhouse conservatory pavilion bandstand
""".split()

ROOMS = """
kitchen bedroom bathroom living room dining room office studio hallway
attic basement garage nursery loft lobby corridor classroom ballroom
lounge library conservatory cellar porch patio veranda terrace
""".split()
# multi-word rooms
ROOMS = ["kitchen", "bedroom", "bathroom", "living room", "dining room",
         "office", "studio", "hallway", "attic", "basement", "garage",
         "nursery", "loft", "lobby", "corridor", "classroom", "ballroom",
         "lounge", "library", "conservatory", "cellar", "patio", "veranda",
         "kids room", "home office", "laundry room", "dressing room",
         "waiting room", "meeting room", "hotel room", "guest room"]

PEOPLE = """
woman man girl boy child couple family baby kid student tourist bride groom
businessman businesswoman mother father mom dad teenager toddler daughter son
brother sister grandmother grandfather doctor nurse chef waiter waitress
farmer soldier pilot teacher worker artist musician dancer runner cyclist
hiker surfer skier swimmer traveler photographer model gardener fisherman
firefighter engineer scientist lady gentleman guy athlete player fan
customer shopper passenger driver rider climber skater snowboarder diver
kayaker golfer jogger mechanic carpenter builder painter plumber electrician
baker butcher barber hairdresser florist tailor shopkeeper vendor seller
merchant cashier clerk receptionist secretary manager employee boss
colleague partner friend neighbour neighbor guest visitor host hostess
bridesmaid groomsman priest monk nun pilgrim volunteer protester policeman
policewoman officer guard sailor captain cowboy cowgirl shepherd beekeeper
hunter ranger lifeguard coach referee judge lawyer banker accountant
architect designer writer blogger journalist reporter pupil schoolgirl
schoolboy graduate newborn infant twin teen adult senior pensioner veteran
hipster
""".split() + [
    "police officer", "young woman", "young man", "old man", "old woman",
    "little girl", "little boy", "young girl", "young boy", "pregnant woman",
    "elderly woman", "elderly man", "construction worker", "office worker",
    "teenage girl", "teenage boy", "middle-aged man", "middle-aged woman",
    "business man", "business woman", "young mother", "young father"]
PEOPLE_PL_EXTRA = [
    "people", "friends", "children", "kids", "tourists", "students", "fans",
    "spectators", "visitors", "guests", "a group of people",
    "a group of friends", "business people", "young people", "a crowd",
    "families", "a couple", "a family", "protesters", "volunteers",
    "shoppers", "passengers", "players", "dancers", "musicians", "workers",
    "soldiers", "the crowd", "the team", "supporters", "locals", "residents"]

ADJECTIVES = """
beautiful old new little small big large colorful modern vintage
traditional classic abstract natural fresh wild ancient historic famous
popular empty open rustic retro elegant stylish lovely pretty cute tiny huge
tall long short wide narrow bright dark light soft hard smooth rough shiny
golden wooden simple luxury rural urban tropical exotic romantic magical
mysterious peaceful quiet busy crowded lonely funny strange unusual unique
rare typical original perfect amazing wonderful stunning gorgeous
spectacular impressive majestic dramatic vibrant pastel neon minimalist
geometric floral striped decorative ornate antique handmade homemade festive
contemporary industrial cultural religious medieval gothic victorian baroque
colonial oriental giant miniature enormous massive delicate fragile sturdy
solid flat round square rectangular circular oval curved broken abandoned
ruined rusty dusty dirty clean cozy cosy comfortable spacious sparkling
transparent metallic plastic leather ceramic digital electric electronic
mechanical wireless portable professional creative artistic realistic
surreal fantasy futuristic cosmic marine aquatic botanical agricultural
picturesque scenic panoramic underwater evergreen blooming wet dry hot cold
warm cool heavy hollow glowing luminous glittering translucent crystal
marble concrete woolen cotton silk velvet paper glass musical graphic
cinematic poetic theatrical educational medical scientific nautical
tribal ethnic bohemian boho chic shabby elegant posh fancy cheap expensive
precious valuable royal imperial national local regional seasonal annual
daily official public private secret hidden famous legendary iconic
african american british french italian spanish mexican japanese chinese
indian greek russian german scandinavian mediterranean nordic arctic
alpine coastal northern southern eastern western central asian european
""".split()

ADJ_PERSON = """
young happy smiling beautiful little old senior attractive handsome pretty
cute elderly pregnant blond blonde bearded tired sad serious confident
successful busy fashionable stylish sporty athletic thoughtful pensive
cheerful joyful laughing playful curious friendly lonely worried angry
scared excited surprised relaxed sleepy hungry fit slim muscular tall asian
african american caucasian european indian teenage adult mature cheerful
professional female male elegant sexy gorgeous lovely shy proud brave
determined focused happy caring loving
""".split()

ADJ_FOOD = """
delicious fresh homemade healthy tasty organic ripe juicy crispy crunchy
creamy spicy salty sweet sour traditional italian french mexican japanese
grilled roasted baked fried boiled steamed smoked frozen chilled iced sliced
chopped stuffed raw vegan vegetarian gourmet hot cold warm rustic seasonal
local classic glazed caramelized marinated toasted whole mini
""".split()

ADJ_SCENE = """
beautiful scenic peaceful snowy sunny cloudy rainy foggy misty stormy windy
frosty icy autumn autumnal spring summer winter tropical rocky sandy green
lush dense deep calm quiet remote wild rural coastal alpine northern
southern eastern western picturesque idyllic majestic dramatic stunning
panoramic famous historic empty crowded busy dark frozen dry vast wide
distant hidden secret old ancient small little beautiful mountainous
volcanic golden
""".split()

# Rarer real words, appended after the common lists (so they sit further
# down the Zipf ranking).
MORE_OBJECTS = """
spatula ladle whisk colander grater peeler strainer skillet wok saucepan
casserole blender mixer juicer grinder corkscrew thermos flask canteen
lunchbox napkin tablecloth placemat coaster doily tray platter saucer goblet
tumbler pitcher jug carafe decanter teacup ramekin cauldron cleaver
chopsticks skewer tongs armchair recliner ottoman footstool loveseat futon
dresser nightstand sideboard credenza hutch armoire vanity barstool
workbench chest coffer locker bookshelf coatrack hanger canopy blind
shutter awning skylight dormer gable gutter drainpipe radiator thermostat
fan heater humidifier tuxedo blazer overcoat parka anorak poncho cape cloak
shawl kimono sari tunic kaftan corset leotard tracksuit jumpsuit overalls
romper onesie bib bonnet beanie beret fedora sombrero stetson turban
headscarf hijab veil bandana headband locket cufflink lanyard keychain
clutch tote satchel rucksack duffel moccasin loafer clog espadrille stiletto
projector printer scanner router charger cable adapter battery joystick
gamepad console turntable amplifier synthesizer metronome stethoscope
thermometer microscope telescope binoculars calculator typewriter
gramophone phonograph camcorder webcam smartwatch chisel mallet crowbar
pliers clamp vise anvil trowel pickaxe sledgehammer scythe sickle pitchfork
hoe spade bolt screw nail rivet hinge padlock latch doorknob handle lever
pulley crank gear sprocket piston valve nozzle hydrant sprinkler funnel
sieve limousine convertible pickup jeep minivan hatchback sedan coupe
roadster trolley streetcar monorail gondola rickshaw chariot stagecoach
caravan camper motorhome trailer forklift bulldozer excavator tank
ambulance firetruck hearse catamaran schooner galleon dinghy raft barge
tugboat trawler steamboat hovercraft seaplane glider biplane airship
zeppelin blimp spaceship satellite boulder gravel cobblestone stalactite
geode fossil amber coral seaweed kelp driftwood pinecone acorn chestnut
toadstool lichen algae petal stem thorn bud blossom sapling seedling shrub
haystack hay straw tumbleweed icicle snowflake hailstone raindrop dewdrop
puddle ripple tide whirlpool iceberg avalanche archway colonnade portico
rotunda turret battlement parapet rampart drawbridge moat bastion citadel
belfry steeple minaret cupola vault crypt nave altar pulpit pew fresco
frieze cornice balustrade banister railing handrail mezzanine atrium foyer
vestibule alcove niche cloister quadrangle arbor townhouse penthouse
duplex condominium tenement silo granary stable kennel coop aviary shed
goalpost net hoop backboard scoreboard trophy medal podium whistle
stopwatch dumbbell barbell kettlebell treadmill paddle oar puck
shuttlecock javelin discus hurdle saddle stirrup bridle harness reins
wetsuit snorkel flipper goggles parachute paraglider xylophone tambourine
maraca castanet bagpipe clarinet oboe bassoon trombone tuba bugle cornet
mandolin lute sitar didgeridoo gong cymbal bongo conga marimba organ
harpsichord abacus almanac amulet antenna apron aquarium atlas axle
bauble beacon bellows billboard blueprint bobbin bollard bonfire bookmark
boomerang bottlecap bracket brazier briquette buckle bullhorn bunting
buoy cairn calendar candlestick cannon canister capsule cartwheel
catapult cellophane censer chalice chalkboard chessboard chime clipboard
cockpit cocoon compass confetti cork crate crayon crib crossbow crutch
cufflinks cushion dartboard dashboard dial dice dipstick dollhouse domino
doorbell doorframe drainboard drawstring dumpster dustpan earmuffs easel
eggcup emblem escalator fencepost figurehead filament firecracker
firewood fishbowl fishhook flagpole flask flowerbed foghorn footbridge
fountain frisbee gangway garter gazette girder glove gravestone
greeting grille guardrail gumball gurney hairpin hammock hatchet headlamp
headlight hearth helm hinge hourglass hubcap icebox incense inkwell jigsaw
kayak kiln knapsack lamppost lattice lectern lifebuoy lightbulb lighter
lipstick lockbox loudspeaker mailbag manhole mantelpiece marquee mast
matchbox meter milestone millstone mousetrap mudguard music nameplate
necktie notepad obelisk odometer outboard padlock pagoda paperweight
parasol passport pedestal pendulum periscope pinwheel pipe placard
plank plaque plinth plough plow pogo porthole postbox pouch pushchair
quiver rafter rattle receipt reel rein ribbon rolltop rosette rudder
sachet safe sandbag sandcastle satchel scaffold scarecrow scoreboard
scroll seashell sextant shovel signpost skylight slingshot snowglobe
snowman spinner spittoon spyglass stapler steeple stencil stepladder
stethoscope stool streamer sundae sunhat sunroof surfboard suspenders
swatch tabletop tankard tapestry teacart telegraph thimble tiller
toadstool tombstone toolbox totem towel trapdoor trellis tricycle trinket
tripwire trolley trowel tureen turnstile tweezers umbrella unicycle urn
valise vase vending veneer viaduct visor wardrobe washboard washbasin
waterwheel weathercock wheelchair whirligig windchime windowsill windshield
wishbone woodpile workshop wristband yoke zipper
""".split()

MORE_FOOD = """
brisket meatball meatloaf kebab falafel gyro shawarma paella risotto
lasagna ravioli gnocchi spaghetti linguine fettuccine tortellini
cannelloni calzone quiche frittata crepe tortilla quesadilla enchilada
tamale empanada samosa pakora naan chapati roti biryani dal tikka korma
ramen udon soba pho tempura teriyaki sashimi wonton bao kimchi bibimbap
bulgogi fondue raclette pierogi borscht goulash strudel schnitzel
bratwurst sauerkraut crumble cobbler trifle tiramisu cannoli baklava
churros eclair profiterole fudge toffee caramel nougat marzipan praline
truffle lollipop marshmallow jellybean licorice custard mousse parfait
sorbet granita popsicle cheesecake shortbread gingerbread flapjack
scone waffle pancake crumpet bun roll pita ciabatta sourdough rye
pumpernickel cracker breadstick crouton dumpling gravy stew chowder bisque
gazpacho minestrone consomme broth casserole stirfry kebab skewer
""".split()

MORE_ANIMALS = """
antelope gazelle impala wildebeest warthog okapi tapir capybara chinchilla
ferret weasel stoat mink marten wolverine lemming vole shrew mole gecko
salamander newt axolotl python cobra viper rattlesnake anaconda boa
tarantula scorpion centipede millipede cricket grasshopper locust cicada
firefly mosquito termite caterpillar larva tadpole clam scallop barnacle
urchin manatee narwhal orca stingray swordfish marlin barracuda piranha
eel catfish trout carp pike perch minnow sardine anchovy herring mackerel
halibut flounder mallard pheasant partridge quail grouse ostrich emu
kiwi condor osprey buzzard kestrel sparrowhawk egret ibis spoonbill
bittern plover sandpiper curlew tern gannet puffin loon grebe coot
moorhen bluebird cardinal oriole tanager warbler thrush blackbird
nuthatch chickadee titmouse goldfinch bullfinch chaffinch siskin
yak ox heifer steer mule burro ram ewe billy kid colt filly gelding
""".split()

MORE_PEOPLE = """
acrobat juggler clown magician ventriloquist mime puppeteer busker knight
samurai ninja viking pirate gladiator pharaoh emperor empress queen king
prince princess duchess duke sheriff detective spy cosmonaut explorer
adventurer mountaineer backpacker nomad refugee immigrant villager peasant
blacksmith cobbler weaver potter sculptor mason bricklayer welder
lumberjack miner surgeon dentist paramedic midwife pharmacist vet
veterinarian optician therapist psychologist professor lecturer tutor
librarian curator archaeologist astronomer biologist chemist physicist
geologist botanist zoologist inventor programmer developer technician
operator conductor composer pianist violinist guitarist drummer cellist
vocalist soprano tenor ballerina bartender barista sommelier butler
maid nanny babysitter courier postman mailman janitor porter doorman
chauffeur valet jockey groom stableman ranger warden sentry lifeguard
""".split()

ABSTRACT = """
love success freedom business teamwork education technology innovation
growth money finance health fitness happiness friendship family peace hope
faith luck time nature travel adventure fashion beauty style design art
music culture history science medicine research energy power strength
leadership strategy communication marketing management security safety
privacy ecology environment sustainability recycling pollution climate
charity solidarity diversity equality justice democracy wisdom knowledge
creativity imagination inspiration motivation ambition achievement victory
competition cooperation partnership relationship romance passion
loneliness sadness grief fear anger stress anxiety depression relaxation
meditation mindfulness wellness nutrition diet lifestyle luxury poverty
wealth investment banking insurance retirement savings economy industry
agriculture tourism hospitality transport logistics construction
architecture engineering mathematics physics chemistry biology geography
astronomy philosophy religion spirituality tradition heritage celebration
holiday vacation weekend childhood youth maturity aging memory nostalgia
""".split()

MORE_ADJ = """
abundant absurd accurate active adventurous affordable aged agile airy
alert alive ambitious ample angelic angular animated anxious arched arid
aromatic artificial ashen assorted astonishing atmospheric attentive
authentic average awesome awkward balmy bare barren bashful beloved bent
bizarre blank bleak blissful blurry bold bony boring bouncy brave breezy
brief brilliant brisk bubbly bulky bumpy burly candid capable careful
careless cautious charred chubby chunky classy clever clumsy coarse
colossal compact complex cosmopolitan courageous crazy creepy crisp
crooked cuddly cultivated curly cylindrical damp dapper daring dazzling
deadly decent decorated defiant delightful detailed devoted dim discreet
distinct divine dizzy domestic dominant drab dreamy dreary drowsy dual
dull durable dusky dynamic eager early earnest earthy easy eccentric
edible eerie efficient elaborate elevated eminent emotional endless
energetic enchanted enchanting endangered epic erect essential eternal
ethereal everyday exact excellent exciting exhausted expansive exquisite
extravagant extreme fabulous faded faint fair faithful fake familiar
fascinating feathered fearless feisty fertile fierce fine firm flawless
fleecy flexible flimsy fluffy fluid foamy forgotten fortunate fragrant
frail freckled free frightened frigid frilly frizzy frosted fruitful
fuzzy gentle genuine ghostly giddy gifted gigantic glamorous gleaming
glistening gloomy glorious glossy graceful gracious grand grateful grave
greasy grim grimy grizzled groovy grotesque grubby gusty hairy handy
harmless harsh hazy heartfelt hearty heavenly hefty helpful hilarious holy
homely honest hopeful humble humid hurried ideal idle illuminated immense
immortal impeccable inflatable informal innocent inquisitive intense
intricate inviting iridescent irregular isolated jagged jaunty jazzy jolly
jovial joyous jubilant keen kind knotty lanky lasting lavish leafy lean
lengthy lifeless lightweight limp lively loud lovable low loyal lucky
lumpy luxurious mellow melodic memorable merry mighty mild milky mixed
moderate modest moist monstrous monumental moody mossy motionless muddy
muffled murky mushy muted naughty neat nervous nifty nimble noble noisy
nostalgic notable novel nutty obedient obscure odd oily ominous opulent
orderly ordinary ornamental outdoor outgoing overcast overgrown pale
parched passionate patient peculiar perky petite picky plain pleasant
plentiful plump plush pointed pointy polished polite pompous poor powerful
pristine prickly puffy pungent pure quaint quick quirky radiant ragged
rapid recent refined regal reliable remarkable restful rich rickety rigid
robust rosy rotten rowdy rugged sacred sandy sassy scaly scarce scary
scattered scented scruffy secluded secure serene severe shabby shaggy
shallow sharp sheer shimmering silky silly sincere skinny sleek slender
slick slimy slippery sloppy slow smoky snappy sneaky snug soggy solemn
somber sophisticated sparse speckled speedy spiky spiral spirited
splendid spooky spotless spotted sprawling squeaky stale stark starry
steady steamy steep sticky stiff still stout striking stubborn sublime
subtle sugary sunlit superb supreme swift tame tangled tart tasteful
tattered tender tense terrific textured thick thorny thrilling tidy tight
timid tinted tough towering tranquil treasured tremendous trendy trusty
twinkling ugly ultimate unfinished unkempt unruly untidy upbeat upright
useful vacant vague valiant vast velvety vertical vicious victorious
vigilant vigorous virtual visible vivid volcanic wacky waterproof wavy
weary weathered weird whimsical whole wicked wiggly windswept wise
wistful witty wobbly woolly wrinkled youthful zany zesty
""".split()

MORE_VERBS_T = """
adjust adore assemble attach bathe blow braid brush bury carve collect
comb cover cradle crush cuddle deliver dig dip display dry dust embrace
empty fill fold frame gather grab guide hang harvest hide inspect iron
juggle knit knead label launch lick light load measure melt mend milk mop
offer organize pat pin plow polish press prune raise repair roast rock
roll rub scoop scrub sew shake shape share shave shear shovel sip sketch
smash sniff sort spin spray spread squeeze stack stir stitch stretch
stroke sweep swing tap tickle tie toss trim twist unload untie wave weave
weigh whip whisk wipe
""".split()

COLOURS = """
white black red blue green yellow pink purple brown orange grey gray
silver golden gold beige cream ivory turquoise teal navy violet lilac
lavender magenta crimson maroon burgundy coral peach mint olive emerald
khaki tan bronze copper scarlet amber indigo cyan aqua charcoal
""".split()

MATERIALS = """
wood metal glass plastic paper leather cotton wool silk denim lace velvet
stone marble concrete brick ceramic porcelain bamboo wicker straw rubber
crystal oak pine walnut steel iron copper brass bronze granite slate
""".split()

VERBS_T = """
hold eat drink read watch play carry throw catch kick ride drive push pull
open cook bake cut paint draw write build fix clean wash wear hug kiss feed
use take make buy sell check touch pick plant water decorate prepare
examine show serve pour mix chop peel slice grill fry taste smell hold
lift climb cross explore visit enjoy admire photograph film record
celebrate open wrap unwrap pack unpack sign paint repair install design
create arrange carry drag chase hunt guard protect greet welcome hold
""".split()

VERBS_I = """
walk run sit stand play smile jump dance swim fly sleep laugh pose rest
wait relax work study climb fall grow float glow shine sail surf ski skate
hike cycle sing talk cry cheer celebrate travel shop eat drink read cook
fish camp kneel lie lean look stare hide bloom graze hunt nest perch soar
dive splash wade paddle row race train exercise meditate pray vote march
protest perform compete score win lose
""".split()

# Hypernyms used by CC3M in place of named entities.
ENTITIES = [
    "actor", "person", "actor", "person", "football player", "politician",
    "celebrity", "pop artist", "singer", "actor", "model", "fashion model",
    "comedian", "rock artist", "country artist", "musician", "author",
    "tv presenter", "television presenter", "film director", "director",
    "film producer", "business executive", "businessperson", "athlete",
    "tennis player", "basketball player", "baseball player",
    "american football player", "ice hockey player", "golfer", "cricketer",
    "boxer", "racing driver", "cyclist", "rugby union player",
    "soccer player", "dj", "rapper", "hip hop artist", "jazz musician",
    "composer", "artist", "painter", "fashion designer", "designer", "chef",
    "royal person", "noble person", "monarch", "military commander",
    "religious leader", "astronaut", "scientist", "economist",
    "film character", "fictional character", "cartoon character",
    "television character", "video game character", "comic book character",
    "reality television participant", "dancer", "choreographer",
    "photographer", "poet", "novelist", "screenwriter", "entrepreneur",
    "philanthropist", "socialite", "olympic athlete", "figure skater",
    "skier", "snowboarder", "surfer", "skateboarder", "wrestler",
    "mixed martial artist", "martial artist", "jockey", "coach",
    "football coach", "manager", "referee", "journalist", "broadcaster",
    "governmental jurisdiction", "sports commentator", "organization founder",
]
TEAMS = [
    "football team", "sports team", "football team", "basketball team",
    "baseball team", "american football team", "ice hockey team",
    "rugby union team", "cricket team", "national football team",
    "rugby league team", "football club", "sports club",
]
ORGS = [
    "organization", "company", "business", "retail business",
    "automobile make", "brand", "government agency", "political party",
    "university", "newspaper", "magazine", "broadcaster", "tv network",
    "record label", "airline", "charity", "non-profit organization",
    "sports association", "consumer product", "car model",
]
PLACES_H = [
    "city", "country", "city", "us state", "capital city", "county",
    "island", "region", "province", "administrative division",
    "tourist attraction", "neighbourhood", "village", "town", "river",
    "mountain range", "national park", "building", "venue", "sports venue",
    "borough", "state", "hotel", "lake", "beach", "street", "district",
]
EVENTS = [
    "the premiere of the film", "the awards", "the festival",
    "the world premiere", "the gala", "the fashion show", "the match",
    "the game", "the tournament", "the championship", "the concert",
    "the ceremony", "a press conference", "the launch", "the party",
    "the event", "the annual awards", "the film festival",
    "the screening", "the music festival", "the charity gala",
    "the opening night", "the exhibition", "the fundraiser", "the parade",
    "the grand prix", "the final", "the semi-final", "the race",
]
WORKS = [
    "film", "tv programme", "tv series", "television series", "album",
    "song", "book", "novel", "video game", "musical", "play", "opera",
    "comic book", "animated series", "documentary", "stage play",
]
EVENT_VERBS = [
    "attends", "arrives at", "attends", "poses at", "arrives for",
    "attends", "performs at", "speaks at", "leaves", "walks the red carpet at",
    "poses for photographers at", "attends the after party for",
]
EVENT_VERBS_PL = [
    "attend", "arrive at", "attend", "pose at", "arrive for", "attend",
    "perform at", "speak at", "leave", "walk the red carpet at",
    "pose for photographers at", "attend the after party for",
]
NEWS_VERBS = [
    "celebrates", "reacts", "looks on", "warms up", "reacts after missing a chance",
    "celebrates after scoring", "shoots", "runs with the ball",
    "controls the ball", "in action", "competes", "poses",
    "celebrates with his teammates", "leaves the field", "speaks to the media",
]
TIMES = [
    "at night", "at sunset", "at sunrise", "in the morning", "in winter",
    "in summer", "in autumn", "in spring", "during the day", "at dusk",
    "at dawn", "in the evening", "on a sunny day", "on a rainy day",
    "in the fall", "during sunset", "during the night", "in the snow",
    "in the rain", "under the stars", "on a cloudy day", "at twilight",
    "on a summer day", "on a winter day", "at christmas", "at the weekend",
]
HOLIDAYS = [
    "christmas", "new year", "halloween", "easter", "valentine 's day",
    "thanksgiving", "mother 's day", "father 's day", "birthday",
    "independence day", "holiday", "wedding", "anniversary", "summer",
]
SPORTS = [
    "football", "soccer", "basketball", "baseball", "tennis", "golf",
    "cricket", "rugby", "hockey", "volleyball", "boxing", "cycling",
    "running", "swimming", "surfing", "skiing", "yoga", "fitness",
]
PREPS_LOC = [
    "on", "in", "at", "near", "by", "under", "behind", "in front of",
    "next to", "on top of", "inside", "outside", "along", "across",
    "above", "beside", "around", "over", "through", "against",
]
STYLES = [
    "vector illustration", "illustration", "vector", "cartoon illustration",
    "3d illustration", "3d rendering", "3d render", "watercolor painting",
    "hand drawn illustration", "hand-drawn illustration", "sketch",
    "drawing", "digital art", "vector image", "icon", "flat illustration",
    "line art", "seamless pattern", "pattern", "background", "design",
    "logo", "silhouette", "cartoon", "doodle", "engraving", "poster",
]
# Non-alphabetical tokens real CC3M captions contain.
HYPHENATED = [
    "hand-drawn", "old-fashioned", "black-and-white", "well-known",
    "mid-century", "high-rise", "long-haired", "full-length", "low-poly",
    "one-of-a-kind", "eye-catching", "hand-painted", "middle-aged",
    "world-famous", "award-winning", "state-of-the-art", "all-inclusive",
    "up-to-date", "three-dimensional", "hand-made", "open-air",
]
HYPH_NOUNS = ["t-shirt", "e-mail", "x-ray", "wi-fi", "self-portrait",
              "close-up", "co-founder", "ice-cream", "make-up", "check-in"]
PLURAL_ONLY = ("jeans", "trousers", "pants", "shorts", "pajamas", "scissors",
               "headphones", "sunglasses", "glasses", "noodles", "fries",
               "chips", "beans", "peas", "streets", "rooftops", "woods",
               "rocks", "dunes", "ruins", "sand dunes", "chopsticks",
               "binoculars", "pliers", "tongs", "goggles", "overalls",
               "cufflinks", "earmuffs", "tweezers", "suspenders", "dice", "herbs", "spices", "eggs", "cookies",
               "cupcakes", "vegetables", "flowers", "mountains", "clouds",
               "stars", "rocks", "waves", "dunes", "ruins", "stairs")
NUMBERISH = ["3d", "4k", "2d", "1st", "2nd", "3rd", "4th", "5th", "18th",
             "19th", "20th", "21st", "10th", "50th", "100th", "360", "24/7",
             "mp3", "covid-19", "f1", "b&w", "dj", "v8", "9/11", "#"]

# Accented words occasionally seen in captions (still alphabetical).
ACCENTED = ["café", "cafés", "résumé", "jalapeño", "piñata", "crème",
            "brûlée", "naïve", "fiancé", "fiancée", "entrée", "décor",
            "façade", "soufflé", "purée", "rosé", "pâté", "doppelgänger"]

AN_EXCEPT = frozenset(["hour", "honest", "honour", "honor", "heir",
                       "hourglass"])
A_EXCEPT = frozenset(["university", "unicorn", "uniform", "unique", "one",
                      "european", "user", "useful", "usual", "union",
                      "unit", "ukulele", "utility", "us", "euro", "ufo"])


def article(word):
    if word.endswith(PLURAL_ONLY):
        return ""
    first = word.split(" ", 1)[0]
    if first in AN_EXCEPT:
        return "an"
    if first in A_EXCEPT:
        return "a"
    return "an" if first[0] in "aeiou" else "a"


IRREGULAR_PL = {
    "man": "men", "woman": "women", "child": "children", "person": "people",
    "mouse": "mice", "goose": "geese", "foot": "feet", "tooth": "teeth",
    "sheep": "sheep", "deer": "deer", "fish": "fish", "moose": "moose",
    "bison": "bison", "buffalo": "buffalo", "elk": "elk", "shrimp": "shrimp",
    "salmon": "salmon", "squid": "squid", "cod": "cod", "tuna": "tuna",
    "leaf": "leaves", "knife": "knives", "wolf": "wolves", "shelf": "shelves",
    "calf": "calves", "life": "lives", "loaf": "loaves", "scarf": "scarves",
    "potato": "potatoes", "tomato": "tomatoes", "hero": "heroes",
    "cactus": "cacti", "samurai": "samurai", "aircraft": "aircraft",
    "series": "series", "species": "species", "trout": "trout",
    "chopsticks": "chopsticks", "binoculars": "binoculars", "pliers": "pliers",
    "tongs": "tongs", "goggles": "goggles", "overalls": "overalls",
    "cufflinks": "cufflinks", "earmuffs": "earmuffs", "tweezers": "tweezers",
    "suspenders": "suspenders", "dice": "dice", "music": "music",
    "carp": "carp", "swordfish": "swordfish", "catfish": "catfish",
    "goldfish": "goldfish", "starfish": "starfish", "jellyfish": "jellyfish",
    "ox": "oxen", "larva": "larvae", "fungus": "fungi", "jeans": "jeans", "pants": "pants", "shorts": "shorts",
    "trousers": "trousers", "pajamas": "pajamas", "scissors": "scissors",
    "headphones": "headphones", "sunglasses": "sunglasses",
}


def plural(word):
    if " " in word:
        head, last = word.rsplit(" ", 1)
        return head + " " + plural(last)
    if word in IRREGULAR_PL:
        return IRREGULAR_PL[word]
    if word.endswith("man") and word not in ("human", "german", "roman"):
        return word[:-3] + "men"
    if word.endswith("fe") and word not in ("cafe", "safe", "giraffe"):
        return word[:-2] + "ves"
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and len(word) > 1 and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


DOUBLE = frozenset("""run swim sit cut hit shop jog stop drop plan skip
hug chop dig grab nap pat pet wrap unwrap rob rub scrub spin stir tap trim
win drag dip knit mop pin sip whip clap hop nod shrug step snap slam ship
strip grip drip flip trip zip plug drum hum jam scan fan tan skim spot knot
plot stab beg chat trot put set get let begin
""".split())


def third_person(v):
    if v.endswith(("s", "x", "z", "ch", "sh", "o")):
        return v + "es"
    if v.endswith("y") and v[-2] not in "aeiou":
        return v[:-1] + "ies"
    return v + "s"


def gerund(v):
    if v in DOUBLE:
        return v + v[-1] + "ing"
    if v == "lie":
        return "lying"
    if v.endswith("ie"):
        return v[:-2] + "ying"
    if v.endswith("e") and not v.endswith(("ee", "ye", "oe")) and v != "be":
        return v[:-1] + "ing"
    return v + "ing"


def dedupe(seq):
    seen = set()
    out = []
    for w in seq:
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


# --------------------------------------------------------------------------
# Long tail of pseudo-words (fixed, independent of the seed).
# --------------------------------------------------------------------------
ONSETS = ("b bl br c ch cl cr d dr f fl fr g gl gr h j k l m n p pl pr r "
          "s sc sh sk sl sn sp st sw t th tr v w").split() + [""] * 5
MID_ONSETS = ("b c d f g h k l m n p r s t v z b d l m n r s t "
              "ch sh st tr pl br th").split()
NUCLEI = "a e i o u a e i o u a e i o a i o ai ea ee oo ou".split()
CODAS = "n r l s t m nd nt st rk ck ng ll rd ss x sh th p ld rn".split()
NOUN_SUFFIXES = [""] * 10 + "er a ia on ite ium ella ino ett ard".split()
ADJ_SUFFIXES = "ic ous al ish ian y ful less ese ine ed ary ive ent".split()

TAIL_NOUNS = 19000
TAIL_ADJS = 6000
TAIL_SEED = 20180715
TAIL_OFF = 5000  # fixed: the tail is the same "language" for every seed


def build_tail(reserved):
    """Deterministic list of unique alphabetic pseudo-words (nouns, adjs)."""
    r = random.Random(TAIL_SEED)
    rc = r.choice
    seen = set(reserved)

    def word(nsyl, suffixes):
        parts = [rc(ONSETS)]
        for k in range(nsyl):
            if k:
                parts.append(rc(MID_ONSETS))
            parts.append(rc(NUCLEI))
            if (k == nsyl - 1 and r.random() < 0.65) or r.random() < 0.2:
                parts.append(rc(CODAS))
        w = "".join(parts)
        suf = rc(suffixes)
        if suf and w[-1] in "aeiouy" and suf[0] in "aeiouy":
            suf = suf[1:]
        return w + suf

    def make(count, suffixes):
        out = []
        while len(out) < count:
            x = r.random()
            nsyl = 1 if x < 0.12 else 2 if x < 0.72 else 3
            w = word(nsyl, suffixes)
            if 4 <= len(w) <= 11 and w not in seen:
                seen.add(w)
                out.append(w)
        return out

    return make(TAIL_NOUNS, NOUN_SUFFIXES), make(TAIL_ADJS, ADJ_SUFFIXES)


# --------------------------------------------------------------------------
# Caption grammar
# --------------------------------------------------------------------------
class Captioner:
    # probabilities that a noun / adjective slot draws from the long tail
    P_TAIL_NOUN = 0.21
    P_TAIL_ADJ = 0.14

    def __init__(self, rng):
        rnd = rng.random
        self.rnd = rnd

        core = set()
        for lst in (OBJECTS, FOOD, PLANTS, ANIMALS, SCENES, BUILDINGS, ROOMS,
                    PEOPLE, ADJECTIVES, ADJ_PERSON, ADJ_FOOD, ADJ_SCENE,
                    COLOURS, MATERIALS, VERBS_T, VERBS_I, MORE_OBJECTS,
                    MORE_FOOD, MORE_ANIMALS, MORE_PEOPLE, ABSTRACT, MORE_ADJ,
                    MORE_VERBS_T):
            for w in lst:
                core.update(w.split())
        reserved = set(core)
        for w in core:
            reserved.update((plural(w), gerund(w), third_person(w)))
        tail_n, tail_a = build_tail(reserved)
        tail_n_pl = [plural(w) for w in tail_n]

        def zipf(words, off):
            """Zipf-Mandelbrot picker over list positions (log-uniform rank)."""
            words = list(words)
            n = len(words)
            base = (n + off) / off
            last = n - 1

            def pick():
                i = int(off * base ** rnd()) - off
                return words[i if i < n else last]
            return pick

        def zipf_i(n, off):
            """Same law, returns the index (for parallel singular/plural lists)."""
            base = (n + off) / off
            last = n - 1

            def pick():
                i = int(off * base ** rnd()) - off
                return i if i < n else last
            return pick

        def uni(words):
            words = list(words)
            n = len(words)

            def pick():
                return words[int(rnd() * n)]
            return pick

        def choice(*words):
            n = len(words)

            def pick():
                return words[int(rnd() * n)]
            return pick

        # ---- word classes --------------------------------------------------
        objs = dedupe(OBJECTS + HYPH_NOUNS + MORE_OBJECTS)
        objs_pl = [plural(w) for w in objs]
        animals = dedupe(ANIMALS + MORE_ANIMALS)
        animals_pl = [plural(w) for w in animals]
        foods = dedupe(FOOD + ACCENTED[:6] + MORE_FOOD)
        blds = dedupe(BUILDINGS)
        obj_i = zipf_i(len(objs), 30)
        tail_i = zipf_i(len(tail_n), TAIL_OFF)
        p_tn = self.P_TAIL_NOUN

        def noun():
            if rnd() < p_tn:
                return tail_n[tail_i()]
            return objs[obj_i()]

        def nouns():
            if rnd() < p_tn:
                return tail_n_pl[tail_i()]
            return objs_pl[obj_i()]

        animal_i = zipf_i(len(animals), 10)

        def animal():
            return animals[animal_i()]

        def animals_f():
            return animals_pl[animal_i()]

        tail_adj = zipf(tail_a, TAIL_OFF)
        core_adj = zipf(dedupe(ADJECTIVES + HYPHENATED + ACCENTED[6:9] + MORE_ADJ), 25)
        p_ta = self.P_TAIL_ADJ

        def adj():
            if rnd() < p_ta:
                return tail_adj()
            return core_adj()

        abstract = zipf(ABSTRACT, 8)
        padj = zipf(dedupe(ADJ_PERSON), 5)
        fadj = zipf(dedupe(ADJ_FOOD), 5)
        sadj_core = zipf(dedupe(ADJ_SCENE), 5)

        def sadj():
            if rnd() < p_ta:
                return tail_adj()
            return sadj_core()

        food = zipf(foods, 10)
        plant = zipf(dedupe(PLANTS), 8)
        scene = zipf(dedupe(SCENES), 8)
        bld = zipf(blds, 6)
        room = zipf(ROOMS, 4)
        psg = dedupe(PEOPLE + MORE_PEOPLE)
        ppl = dedupe(PEOPLE_PL_EXTRA + [plural(w) for w in psg])
        person_w = zipf(psg, 5)
        people_w = zipf(ppl, 5)
        colour = zipf(dedupe(COLOURS), 6)
        material = zipf(dedupe(MATERIALS), 6)
        vt = dedupe(VERBS_T + MORE_VERBS_T)
        vi = dedupe(VERBS_I)
        vt_i = zipf_i(len(vt), 6)
        vi_i = zipf_i(len(vi), 6)
        vt_ing = [gerund(v) for v in vt]
        vt_s = [third_person(v) for v in vt]
        vi_ing = [gerund(v) for v in vi]
        vi_s = [third_person(v) for v in vi]
        ent = zipf(ENTITIES, 3)
        team = zipf(TEAMS, 2)
        org = zipf(ORGS, 3)
        placeh = zipf(PLACES_H, 2)
        event = zipf(EVENTS, 3)
        work = zipf(WORKS, 3)
        ev_i = zipf_i(len(EVENT_VERBS), 2)
        newsverb = uni(NEWS_VERBS)
        when = zipf(TIMES, 4)
        holiday = zipf(HOLIDAYS, 3)
        sport = zipf(SPORTS, 3)
        prep = zipf(PREPS_LOC, 3)
        style = zipf(STYLES, 3)
        numberish = uni(NUMBERISH)
        ordinal = choice("first", "second", "third", "opening", "winning")
        goal_verb = choice("named", "seen", "spotted", "pictured", "chosen",
                           "praised", "photographed", "joined")
        announce = choice("announced", "launched", "unveiled", "revealed",
                          "released", "introduced")
        found = choice("found", "seen", "built", "made", "discovered",
                       "painted", "photographed")
        sport_verb = choice("playing", "playing", "practicing", "watching",
                            "enjoying")
        famous = choice("famous", "popular", "successful", "influential",
                        "talented", "respected", "beloved")
        century = choice("18th", "19th", "17th", "16th", "20th", "15th")
        quant = zipf(["a group of", "a pair of", "a set of", "a pile of",
                      "a collection of", "a row of", "a stack of", "a bunch of",
                      "a couple of", "a variety of", "lots of", "a box of",
                      "a basket of", "a bowl of", "a close - up of",
                      "an assortment of", "a selection of", "a line of"], 3)
        container = zipf(["a cup of", "a glass of", "a plate of", "a bowl of",
                          "a slice of", "a piece of", "a bottle of",
                          "a jar of", "a mug of", "a basket of", "a bunch of",
                          "a box of", "a tray of", "a loaf of", "a pot of"], 3)
        herd = choice("a herd of", "a flock of", "a group of", "a pair of",
                      "a family of", "a pack of", "a colony of")

        def year():
            return str(1900 + int(120 * rnd() ** 0.35))

        def num():
            return str(int(2 + 98 * rnd() ** 2.5))

        def a_(w):
            art = article(w)
            return art + " " + w if art else w

        # ---- phrases --------------------------------------------------------
        def mod():
            """Optional pre-nominal modifiers (with trailing space)."""
            x = rnd()
            if x < 0.16:
                return ""
            if x < 0.56:
                return adj() + " "
            if x < 0.78:
                return colour() + " "
            if x < 0.88:
                return adj() + " " + colour() + " "
            if x < 0.95:
                return adj() + " " + adj() + " "
            return adj() + " " + material() + " "

        def thing():
            x = rnd()
            if x < 0.64:
                return noun()
            if x < 0.80:
                return animal()
            if x < 0.92:
                return food()
            return bld()

        def things():
            x = rnd()
            if x < 0.64:
                return nouns()
            if x < 0.78:
                return animals_f()
            if x < 0.90:
                return plant()
            return food()

        def np():
            x = rnd()
            if x < 0.52:
                return a_(mod() + thing())
            if x < 0.68:
                return "the " + mod() + thing()
            if x < 0.84:
                return mod() + things()
            if x < 0.90:
                return quant() + " " + mod() + things()
            if x < 0.95:
                return container() + " " + food()
            return a_(mod() + thing()) + " with " + mod() + things()

        def np_short():
            return a_(thing()) if rnd() < 0.7 else "the " + thing()

        def person():
            x = rnd()
            if x < 0.45:
                return a_(person_w())
            if x < 0.85:
                return a_(padj() + " " + person_w())
            return "the " + person_w()

        def persons():
            x = rnd()
            if x < 0.65:
                return people_w()
            return padj() + " " + people_w()

        def place():
            x = rnd()
            if x < 0.30:
                return "the " + scene()
            if x < 0.60:
                return a_(sadj() + " " + scene())
            if x < 0.72:
                return "the " + room()
            if x < 0.84:
                return a_(mod() + bld())
            if x < 0.92:
                return "the " + sadj() + " " + scene()
            return a_(placeh())

        def loc():
            return prep() + " " + place()

        def vti():
            return vt_ing[vt_i()]

        def vts():
            return vt_s[vt_i()]

        def vtb():
            return vt[vt_i()]

        def vii():
            return vi_ing[vi_i()]

        def vis():
            return vi_s[vi_i()]

        def vib():
            return vi[vi_i()]

        def ent_ev():
            """Entity (or entities) + agreeing event verb."""
            x = rnd()
            if x < 0.70:
                return ent() + " " + EVENT_VERBS[ev_i()]
            if x < 0.88:
                return ent() + " and " + ent() + " " + EVENT_VERBS_PL[ev_i()]
            return (ent() + " , " + ent() + " and " + ent() + " " +
                    EVENT_VERBS_PL[ev_i()])

        def tailer():
            """Optional trailing extension; gives the long right tail of lengths."""
            x = rnd()
            if x < 0.28:
                return ""
            if x < 0.42:
                return " " + when()
            if x < 0.48:
                return " " + when() + " " + loc()
            if x < 0.60:
                return " " + loc()
            if x < 0.68:
                return " with " + np()
            if x < 0.72:
                return " in the background"
            if x < 0.76:
                return " , " + when()
            if x < 0.80:
                return " in " + placeh()
            if x < 0.87:
                return " with " + np() + " " + loc()
            if x < 0.95:
                return " " + loc() + " " + when()
            return " , " + adj() + " " + nouns() + " " + loc() + tailer()

        def venue():
            x = rnd()
            if x < 0.55:
                return ""
            if x < 0.80:
                return " in " + placeh()
            if x < 0.92:
                return " at " + a_(bld()) + " in " + placeh()
            return " held at " + a_(placeh())

        def dot():
            return " ." if rnd() < 0.5 else ""

        T = []

        def t(w, f):
            T.append((w, f))

        # -- stock photo / object descriptions --------------------------------
        t(26, lambda: f"{np()} on white background{dot()}")
        t(18, lambda: f"{np()} isolated on a white background{dot()}")
        t(8, lambda: f"{mod()}{thing()} isolated on {colour()}")
        t(72, lambda: f"{np()} {loc()}{tailer()}{dot()}")
        t(40, lambda: f"{mod()}{things()} {loc()}{tailer()}")
        t(30, lambda: f"{np()} with {np()}{tailer()}{dot()}")
        t(18, lambda: f"close up of {np()}{tailer()}")
        t(10, lambda: f"close - up of {np()} {loc()}")
        t(10, lambda: f"{fadj()} {food()} for sale at {a_(mod() + 'market')}{dot()}")
        t(12, lambda: f"{np()} , {np()} and {np()}{tailer()}")
        t(10, lambda: f"{adj()} {thing()} made of {material()} {loc()}")
        t(14, lambda: f"{colour()} {thing()} with {colour()} {things()}{tailer()}")
        t(14, lambda: f"detail of {np()}{tailer()}")
        t(10, lambda: f"{mod()}{thing()} full of {mod()}{things()}")
        t(10, lambda: f"one of the {things()} at {np_short()}{tailer()}")
        t(12, lambda: f"{things()} and {things()} {loc()}")
        t(10, lambda: f"top view of {np()} on {a_(material() + ' table')}")
        t(8, lambda: f"{np()} against {a_(colour())} sky{dot()}")
        t(12, lambda: f"{fadj()} {food()} on {a_(mod() + 'plate')} with {food()} and {food()}{dot()}")
        t(10, lambda: f"{container()} {fadj()} {food()} on {a_(material() + ' table')}")
        t(8, lambda: f"homemade {food()} with {food()} and {fadj()} {food()}")
        t(6, lambda: f"still life with {things()} and {things()} on {a_(mod() + 'table')}")
        t(6, lambda: f"{np()} hanging on the wall of {a_(room())}")
        t(6, lambda: f"{np()} in the shape of {np()}")
        # -- people ---------------------------------------------------------
        t(56, lambda: f"{person()} {vti()} {np()}{tailer()}{dot()}")
        t(30, lambda: f"{person()} {vii()} {loc()}{tailer()}{dot()}")
        t(18, lambda: f"{persons()} {vii()} {loc()}{tailer()}")
        t(20, lambda: f"portrait of {person()} {when()}{tailer()}")
        t(12, lambda: f"portrait of {person()} with {np()}{dot()}")
        t(18, lambda: f"{person()} with {np()} {loc()}{tailer()}")
        t(12, lambda: f"{person()} wearing {np()} {vii()} {loc()}")
        t(10, lambda: f"{person()} and {person()} {vii()} together{tailer()}")
        t(10, lambda: f"{person()} 's {thing()} {loc()}{tailer()}")
        t(16, lambda: f"{person()} {vts()} {np()} while {vii()} {loc()}{dot()}")
        t(8, lambda: f"{person()} walks along {place()}{tailer()}{dot()}")
        t(8, lambda: f"{persons()} {sport_verb()} {sport()} {loc()}")
        t(6, lambda: f"happy {person_w()} {vii()} {when()}")
        t(6, lambda: f"silhouette of {person()} {vii()} {when()}")
        t(6, lambda: f"businessman {vti()} {np()} in the office")
        t(5, lambda: f"business concept : {person()} {vti()} {np()} on {a_('desk')}")
        t(6, lambda: f"{person()} looks at {np()} through the window{dot()}")
        t(5, lambda: f"{person()} in {a_(colour() + ' ' + noun())} {vis()} {loc()}")
        t(4, lambda: f"{person()} holds {np()} in front of {np()}")
        # -- animals / nature -----------------------------------------------
        t(20, lambda: f"{animals_f()} {vii()} {loc()}{tailer()}")
        t(16, lambda: f"{a_(mod() + animal())} {vis()} {loc()}{dot()}")
        t(8, lambda: f"{herd()} {animals_f()} {vii()} {loc()}")
        t(7, lambda: f"biological species in the {scene()}{dot()}")
        t(8, lambda: f"biological species {vis()} on {np_short()}{tailer()}")
        t(14, lambda: f"{plant()} {loc()}{tailer()}")
        t(10, lambda: f"{adj()} {plant()} in the garden{tailer()}{dot()}")
        t(18, lambda: f"{a_(sadj() + ' ' + scene())} {when()}{tailer()}")
        t(14, lambda: f"sunset over {place()}{tailer()}")
        t(8, lambda: f"sunrise over the {scene()} with {things()}{dot()}")
        t(12, lambda: f"aerial view of {place()}{tailer()}")
        t(16, lambda: f"the view from {place()}{tailer()}{dot()}")
        t(10, lambda: f"view of {place()} from {place()}{tailer()}")
        t(8, lambda: f"the {scene()} : {adj()} {things()} {loc()}")
        t(6, lambda: f"landscape with {things()} and {a_(sadj() + ' ' + scene())} {when()}")
        # -- places / buildings -----------------------------------------------
        t(9, lambda: f"{placeh()} skyline {when()}")
        t(3, lambda: f"{placeh()} at night")
        t(2, lambda: f"{sadj()} {scene()} landscape")
        t(2, lambda: f"{colour()} {thing()} isolated")
        t(2, lambda: f"{fadj()} {food()} closeup")
        t(14, lambda: f"{person()} {vti()} {np()} {loc()} {when()}")
        t(8, lambda: f"{persons()} {vii()} {loc()} during {event()}{dot()}")
        t(8, lambda: f"{a_(sadj() + ' ' + scene())} with {things()} and {np()} {when()}")
        t(6, lambda: f"{person()} sitting on {np()} and {vti()} {np()}{dot()}")
        t(8, lambda: f"a view of {place()} with {np()} in the foreground{dot()}")
        t(5, lambda: f"{np()} is one of the most {adj()} {things()} in {placeh()}{dot()}")
        t(5, lambda: f"{ent()} , one of the most {famous()} {people_w()} in {placeh()} , {vts()} {np()}{dot()}")
        t(5, lambda: f"{person()} and {person()} {vti()} {np()} {loc()}{tailer()}")
        t(10, lambda: f"{a_(mod() + bld())} in the suburbs of a city")
        t(12, lambda: f"{a_(adj() + ' ' + bld())} in {placeh()}{tailer()}{dot()}")
        t(10, lambda: f"tourist attraction in {placeh()}{tailer()}")
        t(10, lambda: f"interior of {a_(adj() + ' ' + bld())}{tailer()}")
        t(14, lambda: f"{a_(adj() + ' ' + room())} with {np()}{tailer()}")
        t(8, lambda: f"the {adj()} {room()} of {a_(bld())} {loc()}")
        t(6, lambda: f"street in the old town of {placeh()}{tailer()}")
        t(5, lambda: f"the main entrance to {a_(adj() + ' ' + bld())} , {when()}")
        # -- illustration / design ------------------------------------------
        t(28, lambda: f"{style()} of {np()}{tailer()}")
        t(14, lambda: f"illustration of a cartoon {animal()} on a white background")
        t(10, lambda: f"vector illustration of {np()} on {colour()} background{dot()}")
        t(7, lambda: f"seamless pattern with {things()} and {things()}")
        t(6, lambda: f"abstract background with {colour()} {things()}")
        t(8, lambda: f"{adj()} {style()} with {np()}")
        t(6, lambda: f"set of {adj()} {things()} icons{dot()}")
        t(6, lambda: f"happy {holiday()} ! {adj()} card with {things()}")
        t(6, lambda: f"{holiday()} card with {np()} and {things()}")
        t(5, lambda: f"{numberish()} {style()} of {np()}")
        t(8, lambda: f"{adj()} {abstract()} concept{tailer()}")
        t(5, lambda: f"concept of {abstract()} and {abstract()} with {np()}{dot()}")
        t(4, lambda: f"{np()} as a symbol of {abstract()}{dot()}")
        t(4, lambda: f"the concept of {abstract()} : {person()} {vti()} {np()}")
        t(3, lambda: f"{abstract()} , {abstract()} and {abstract()} word cloud")
        t(4, lambda: f"{adj()} typography with {things()} for {holiday()} , vector illustration")
        # -- news / celebrity style ---------------------------------------------
        t(28, lambda: f"{ent_ev()} {event()}{venue()}{dot()}")
        t(10, lambda: f"{ent_ev()} {event()} in {placeh()}{dot()}")
        t(10, lambda: f"{ent()} performs on stage during {event()}{dot()}")
        t(8, lambda: f"{ent()} poses for a portrait{tailer()}")
        t(8, lambda: f"{ent()} speaks during a press conference in {placeh()}{dot()}")
        t(12, lambda: f"{ent()} {newsverb()} during the match against {team()}{dot()}")
        t(10, lambda: f"{ent()} celebrates scoring his side 's {ordinal()} goal during the match between {team()} and {team()}")
        t(8, lambda: f"{ent()} of {team()} {newsverb()} during the game against {team()}{dot()}")
        t(6, lambda: f"{ent()} in a scene from the {work()}{dot()}")
        t(5, lambda: f"{ent()} stars as {ent()} in the {work()}")
        t(5, lambda: f"{ent()} , pictured with {person()} , {vts()} {np()}{dot()}")
        t(5, lambda: f"{year()} : {ent()} {vts()} {np()} in {placeh()}")
        t(4, lambda: f"{placeh()} , {year()} : {persons()} {vii()} {loc()}")
        t(5, lambda: f"{ent()} , who {vts()} {np()} , has been {goal_verb()} by {org()}")
        t(5, lambda: f"{org()} has {announce()} {a_(adj() + ' ' + noun())} for the {work()}{dot()}")
        t(4, lambda: f"the {adj()} {thing()} was {found()} in {placeh()} in {year()}")
        t(4, lambda: f"{ent()} and {ent()} at {event()}")
        t(4, lambda: f"{persons()} gather to {vib()} at {event()} in {placeh()}")
        t(3, lambda: f"{ent()} arrives to the {holiday()} party at {a_(bld())} in {placeh()}")
        # -- questions / text-like ----------------------------------------------
        t(6, lambda: f"how to {vtb()} {a_(adj() + ' ' + thing())} ?")
        t(5, lambda: f"what is the best {thing()} for {things()} ?")
        t(4, lambda: f"can you spot the {animal()} in this picture ?")
        t(4, lambda: f"do n't {vtb()} {np()} {loc()}")
        t(4, lambda: f"this {thing()} is {adj()} and {adj()}{dot()}")
        t(4, lambda: f"the {thing()} is {adj()} !")
        t(5, lambda: f"# of the {adj()} {things()} in the world")
        t(4, lambda: f"{num()} {adj()} {things()} to {vtb()} in {placeh()}")
        t(3, lambda: f"the {adj()} {thing()} of {np()}")
        t(3, lambda: f"i love {things()} and {things()} !")
        t(3, lambda: f"we {vtb()} {things()} and {things()}{dot()}")
        t(3, lambda: f"what to wear to {a_(holiday())} party ?")
        t(2, lambda: f"check out this {adj()} {thing()} on {a_(thing())}")
        t(3, lambda: f"{person()} does n't want to {vib()}")
        t(2, lambda: f"{thing()} - {adj()} {things()} for {people_w()}")
        t(2, lambda: f"{persons()} send an e-mail from {a_('laptop')} {loc()}")
        t(3, lambda: f"{adj()} t-shirt with {np()} on it")
        t(3, lambda: f"{numberish()} {adj()} {thing()} {loc()}")
        t(2, lambda: f"{adj()} {thing()} from the {century()} century")
        t(2, lambda: f"{things()} in {a_(adj() + ' ' + thing())} , {year()}")
        t(3, lambda: f"you 'll never guess what this {thing()} is made of")
        t(2, lambda: f"{person()} 's {adj()} {thing()} is {adj()} - {num()} {things()} !")

        def extra():
            x = rnd()
            if x < 0.30:
                return " with " + np()
            if x < 0.55:
                return " " + loc()
            if x < 0.70:
                return " " + when()
            if x < 0.85:
                return " , " + np() + " " + loc()
            return " and " + np()

        self.extra = extra
        table = []
        for w, f in T:
            table.extend([f] * w)
        self.table = table
        self.n_templates = len(T)

    P_EXTRA = 0.16  # chance of one more phrase on captions without final punctuation

    def caption(self):
        t = self.table
        rnd = self.rnd
        c = t[int(rnd() * len(t))]()
        if rnd() < self.P_EXTRA and c[-2] != " ":
            c += self.extra()
        return c


# --------------------------------------------------------------------------
# URLs: realistic image URLs, each unique (embeds a bijection of the row id).
# --------------------------------------------------------------------------
B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
B64URL = B62 + "-_"
HEX = "0123456789abcdef"
ID_MOD = 10 ** 10
ID_MUL = 2654435761  # coprime with 10**10 -> bijection on [0, 10**10)
MASK128 = (1 << 128) - 1
HASH_MUL = 0x9E3779B97F4A7C15F39CC0605CEDC835  # odd -> bijection mod 2**128


def b62(n, width):
    out = []
    for _ in range(width):
        n, k = divmod(n, 62)
        out.append(B62[k])
    return "".join(out)


def b64(n, width):
    out = []
    for _ in range(width):
        out.append(B64URL[n & 63])
        n >>= 6
    return "".join(out)


BLOGS = """
homedesign interiorstyle mytravels foodiecorner dailyinspiration craftyideas
gardenlove weddingbells petlovers outdoorliving styleguide bakingbliss
tinyhouses vintagefinds artsandcrafts familyadventures kitchenstories
designmilk lifestyleblog photodiary wanderlust roadtrips cookingathome
""".split()
SMALL_SITES = """
weddingwire.com homedit.com decoist.com houzz.com etsystatic.com
travelblog.org flickr.com photobucket.com imgur.com tumblr.com
weheartit.com deviantart.net wikimedia.org bbc.co.uk cbc.ca abc.net.au
theguardian.com nydailynews.com latimes.com chicagotribune.com
""".split()
NEWS_HOSTS = [
    ("http://www.telegraph.co.uk/content/dam/", "news"),
    ("https://static.independent.co.uk/s3fs-public/thumbnails/image/", ""),
    ("https://i2-prod.mirror.co.uk/incoming/article", ""),
    ("https://cdn.images.express.co.uk/img/dynamic/", ""),
    ("https://www.thesun.co.uk/wp-content/uploads/", ""),
]


class UrlMaker:
    def __init__(self, rng, seed):
        self.rnd = rng.random
        self.off = (seed * 7919 + 12345) % ID_MOD
        w = []

        def u(weight, f):
            w.extend([f] * weight)

        u(14, self.dailymail)
        u(4, self.dailymail2)
        u(14, self.shutterstock)
        u(6, self.shutterstock2)
        u(4, self.picdn)
        u(8, self.alamy)
        u(12, self.pinimg)
        u(8, self.blogspot)
        u(8, self.wordpress)
        u(6, self.wpcontent)
        u(6, self.lovethispic)
        u(5, self.squarespace)
        u(5, self.news)
        u(3, self.ggpht)
        u(3, self.dreamstime)
        u(3, self.gettyish)
        u(3, self.cdn_shop)
        u(6, self.smallsite)
        u(4, self.imghost)
        self.table = w

    @staticmethod
    def slug(caption, maxw=9, sep="-"):
        ws = [x for x in caption.split() if x.isalpha() and x.isascii()]
        return sep.join(ws[:maxw])

    def date(self, uid):
        # deterministic date in 2009..2018 from the unique id
        d = uid % 3650
        return 2009 + d // 365, 1 + (d % 365) // 31 % 12, 1 + d % 28

    def make(self, i, caption):
        uid = (i * ID_MUL + self.off) % ID_MOD
        t = self.table
        return t[int(self.rnd() * len(t))](uid, caption)

    def dailymail(self, uid, cap):
        y, m, d = self.date(uid)
        ts = 1262304000000 + uid * 37
        return (f"http://i.dailymail.co.uk/i/pix/{y}/{m:02d}/{d:02d}/"
                f"{ts}_wps_{1 + uid % 40}_{self.slug(cap, 6, '_').title()}.jpg")

    def dailymail2(self, uid, cap):
        y, m, d = self.date(uid)
        h = (uid * HASH_MUL) & MASK128
        return (f"http://i.dailymail.co.uk/i/pix/{y}/{m:02d}/{d:02d}/"
                f"{(uid >> 3) % 24:02d}/{h & 0xFFFFFFFFFFFFFFFF:016X}-{uid % 9000000 + 1000000}"
                f"-image-a-{1 + uid % 80}_{1262304000000 + uid * 37}.jpg")

    def shutterstock(self, uid, cap):
        kind = ("photo", "vector", "photo", "illustration")[uid % 4]
        owner = 100000 + (uid * 7) % 3000000
        img = 100000000 + uid % 900000000
        return (f"https://thumb{1 + uid % 10}.shutterstock.com/display_pic_with_logo/"
                f"{owner}/{img}/stock-{kind}-{self.slug(cap, 10)}-{img}.jpg")

    def shutterstock2(self, uid, cap):
        img = 100000000 + uid % 900000000
        return (f"https://image.shutterstock.com/z/stock-photo-{self.slug(cap, 10)}"
                f"-{img}-{uid // 900000000}.jpg")

    def picdn(self, uid, cap):
        return (f"https://ak{uid % 9}.picdn.net/shutterstock/videos/{uid}/thumb/"
                f"{1 + uid % 12}.jpg")

    def alamy(self, uid, cap):
        code = b62(uid * 31 + 7, 6).upper()
        return (f"https://c{uid % 9 + 1}.alamy.com/comp/{code}/"
                f"{self.slug(cap, 10)}-{code}.jpg")

    def pinimg(self, uid, cap):
        h = f"{(uid * HASH_MUL) & MASK128:032x}"
        size = ("736x", "564x", "236x", "originals")[uid % 4]
        return f"https://i.pinimg.com/{size}/{h[:2]}/{h[2:4]}/{h[4:6]}/{h}.jpg"

    def blogspot(self, uid, cap):
        h = (uid * HASH_MUL) & MASK128
        return (f"http://{1 + uid % 4}.bp.blogspot.com/-{b64(h, 11)}/"
                f"{b64(h >> 66, 11)}/AAAAAAAA{b64(uid, 3)}/{b64((h * 0x2545F4914F6CDD1D) & MASK128, 11)}/"
                f"s1600/IMG_{uid % 10000:04d}.JPG")

    def wordpress(self, uid, cap):
        y, m, _ = self.date(uid)
        blog = BLOGS[uid % len(BLOGS)]
        return (f"https://{blog}.files.wordpress.com/{y}/{m:02d}/"
                f"{self.slug(cap, 6)}-{b62(uid, 6).lower()}.jpg?w={(640, 700, 1024)[uid % 3]}")

    def wpcontent(self, uid, cap):
        y, m, _ = self.date(uid)
        blog = BLOGS[(uid // 7) % len(BLOGS)]
        return (f"http://www.{blog}.com/wp-content/uploads/{y}/{m:02d}/"
                f"{self.slug(cap, 7)}-{uid}.jpg")

    def lovethispic(self, uid, cap):
        return (f"http://www.lovethispic.com/uploaded_images/{uid}-"
                f"{self.slug(cap, 6).title()}.jpg")

    def squarespace(self, uid, cap):
        h = f"{(uid * HASH_MUL) & MASK128:032x}"
        return (f"https://static1.squarespace.com/static/{h[:24]}/"
                f"{h[8:32]}/{uid}/{self.slug(cap, 4).upper()}.jpg?format=750w")

    def news(self, uid, cap):
        y, m, d = self.date(uid)
        host, extra = NEWS_HOSTS[uid % len(NEWS_HOSTS)]
        if extra:
            return f"{host}{extra}/{y}/{m:02d}/{d:02d}/{self.slug(cap, 5)}-{uid}.jpg"
        return f"{host}{y}/{m:02d}/{d:02d}/{uid}-{self.slug(cap, 5)}.jpg"

    def ggpht(self, uid, cap):
        h = (uid * HASH_MUL) & MASK128
        return (f"http://lh{3 + uid % 4}.ggpht.com/-{b64(h, 12)}/{b64(h >> 72, 11)}/"
                f"AAAAAAAA{b64(uid, 3)}/{b64((h * 0x2545F4914F6CDD1D) & MASK128, 11)}/IMG_{uid % 10000:04d}.JPG"
                f"?imgmax=800")

    def dreamstime(self, uid, cap):
        return (f"https://thumbs.dreamstime.com/b/{self.slug(cap, 8)}-{uid}.jpg")

    def gettyish(self, uid, cap):
        return (f"https://media.gettyimages.com/photos/{self.slug(cap, 8)}"
                f"-picture-id{uid}?s=612x612")

    def smallsite(self, uid, cap):
        site = SMALL_SITES[uid % len(SMALL_SITES)]
        d = ("images", "img", "photos", "media", "uploads", "pics")[(uid >> 4) % 6]
        return f"http://www.{site}/{d}/{uid}.jpg"

    def imghost(self, uid, cap):
        site = SMALL_SITES[(uid >> 3) % len(SMALL_SITES)]
        return (f"https://img{1 + uid % 6}.{site}/{b62(uid * 13, 7).lower()}/"
                f"{self.slug(cap, 3, '_')}.jpg")

    def cdn_shop(self, uid, cap):
        h = f"{(uid * HASH_MUL) & MASK128:032x}"
        return (f"https://cdn.shopify.com/s/files/1/{uid % 9000 + 1000:04d}/"
                f"{uid % 1000:04d}/products/{h[:20]}.jpg?v={1400000000 + uid}")


# --------------------------------------------------------------------------
# Malformed lines
# --------------------------------------------------------------------------
MALFORMED_KINDS = ["no tab (caption only)", "three tab-separated fields",
                   "empty caption", "caption is only spaces",
                   "invalid UTF-8 bytes"]


def malformed_positions(rows):
    """0-based valid-row indices before which malformed line j is written."""
    return [((j + 1) * rows) // 6 for j in range(5)]


MALFORMED_CAPTIONS = [
    "a man riding a horse on the beach at sunset .",
    "a plate of food on a wooden table",
    "",
    "     ",
    "cafe on the street .",  # written as b"caf\xe9 on the street ."
]


def malformed_line(j, make_url, uid_row):
    """Bytes of malformed line j; its URL is made like a real row's."""
    cap = MALFORMED_CAPTIONS[j]
    url = make_url(uid_row, cap.strip() or "image")
    if j == 0:
        return cap.encode("utf-8") + b"\n"
    if j == 1:
        return (cap + "\t" + url + "\t" + url.rsplit(".", 1)[-1] + "\n").encode("utf-8")
    if j == 4:
        return b"caf\xe9 on the street .\t" + url.encode("utf-8") + b"\n"
    return (cap + "\t" + url + "\n").encode("utf-8")


# --------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, required=True, help="number of valid rows")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True, help="output .tsv path")
    ap.add_argument("--malformed", action="store_true",
                    help="insert 5 malformed lines at fixed positions")
    args = ap.parse_args(argv)
    if args.rows < 0:
        ap.error("--rows must be >= 0")

    t0 = time.perf_counter()
    rng = random.Random(args.seed)
    cap = Captioner(rng)
    urls = UrlMaker(rng, args.seed)

    positions = malformed_positions(args.rows) if args.malformed else []
    mal_at = {p: [] for p in positions}
    for j, p in enumerate(positions):
        mal_at[p].append(j)
    mal_lines = []  # (1-based line number, kind)

    stop = STOPWORDS
    is_content = {}  # word -> 1 if it survives RmStopNalpha else 0
    n_words = 0
    n_content = 0
    line_no = 0
    chunk = []
    CH = 20000
    caption = cap.caption
    make_url = urls.make
    with open(args.out, "wb") as fh:

        def flush():
            if chunk:
                fh.write("".join(chunk).encode("utf-8"))
                chunk.clear()

        def write_malformed(at):
            nonlocal line_no
            flush()
            for j in mal_at.pop(at):
                line_no += 1
                fh.write(malformed_line(j, make_url, args.rows + j))
                mal_lines.append((line_no, MALFORMED_KINDS[j]))

        for i in range(args.rows):
            if i in mal_at:
                write_malformed(i)
            c = caption()
            ws = c.split()
            n_words += len(ws)
            for w in ws:
                k = is_content.get(w)
                if k is None:
                    k = is_content[w] = 1 if (w.isalpha() and w not in stop) else 0
                n_content += k
            chunk.append(c + "\t" + make_url(i, c) + "\n")
            line_no += 1
            if len(chunk) >= CH:
                flush()
        for at in sorted(mal_at):  # only when --rows 0
            write_malformed(at)
        flush()
    elapsed = time.perf_counter() - t0

    n = max(args.rows, 1)
    n_distinct_content = sum(is_content.values())
    err = sys.stderr
    print(f"wrote {args.out}: {args.rows} rows + {len(mal_lines)} malformed lines "
          f"= {line_no} lines in {elapsed:.1f} s "
          f"({cap.n_templates} caption templates)", file=err)
    for ln, kind in mal_lines:
        print(f"  malformed line {ln}: {kind}", file=err)
    print(f"mean words per caption:            {n_words / n:.3f}", file=err)
    print(f"mean words after RmStopNalpha:     {n_content / n:.3f}", file=err)
    print(f"distinct words:                    {len(is_content)}", file=err)
    print(f"distinct words after RmStopNalpha: {n_distinct_content}", file=err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
